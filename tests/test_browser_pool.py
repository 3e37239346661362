"""From an unlabeled pool to a deploy plan on the page, in Debian chromium (issue 44, "Done when"): a policy
evaluated on a 12-row seed set and saved (the command line's calibration, as the page's own would be), then on
Review a pool file uploaded through the real uploader (its bad rows named), scored once with the saved
policy, the two rows ranked first labeled and added as a new set version; on Calibrate the new version is
evaluated with every row copied from stored scores (0 evaluated), saved, and Deploy plans it. The shipped
135M model keeps it CI-sized; the 300-state walkthrough on these pages is measured in docs/review.md ("A pool of
unlabeled states"). The pool is scored in the background: leaving Review while it runs loses nothing, and
coming back shows it."""
from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

from tests.conftest import ROOT, calibrate_cli
from tests.test_browser import browser, choose, nav, settle, start_workbench  # noqa: F401 (fixture)

pytestmark = [pytest.mark.browser]
N_SEED, N_POOL = 12, 10


def test_pool_to_deploy_plan_on_the_page(browser, tmp_path):  # noqa: F811
    from app.core.store import Store

    db, cal, _ = calibrate_cli(tmp_path, "refund-check", N_SEED, "--head", "none")
    store = Store(db)
    store.save_calibrated(json.loads(cal.read_text()))  # what Calibrate's "Save for deployment" keeps
    rows = [json.loads(l) for l in (ROOT / "data" / "labeled" / "refund-check.jsonl").read_text().splitlines() if l]
    later = [r for r in rows if r.get("split") != "train"][N_SEED: N_SEED + N_POOL]
    seed_state = store.labeled_rows(1)[0]["state"]
    upload = tmp_path / "pool.csv"
    upload.write_text("ticket,body\n" + "".join(f"T-{i},\"{r['state']}\"\n" for i, r in enumerate(later))
                      + "T-98,\n" + f"T-99,\"{seed_state}\"\n")  # an empty state; a state already in the set
    url, proc = start_workbench(db)
    ctx = browser.new_context(viewport={"width": 1400, "height": 3000})
    page = ctx.new_page()
    try:
        page.goto(f"{url}/review?policy=refund-check")
        settle(page)
        page.get_by_text("Label from a pool of unlabeled states").click()
        settle(page)
        page.locator("[data-testid=stFileUploaderDropzoneInput]").first.set_input_files(str(upload))
        settle(page)
        page.get_by_role("button", name="Import as a pool").click()
        settle(page)
        expect(page.get_by_text(f"pool #1: {N_POOL} unlabeled rows kept; 2 rows left out")).to_be_visible()
        expect(page.get_by_text(re.compile(rf"line {N_POOL + 2}: the state is empty")).first).to_be_visible()
        expect(page.get_by_text(re.compile(rf"line {N_POOL + 3}: this state is already in the labeled set")).first).to_be_visible()
        page.get_by_role("button", name="Score the pool").click()
        # the scoring runs in the background: wait for its note, not for one settle (the page reruns when it ends)
        expect(page.get_by_text(f"Scored: {N_POOL} pool rows: 0 stored scores reused")).to_be_visible(timeout=300_000)
        expect(page.get_by_text(re.compile(rf"^10 of {N_POOL} open pool rows to label next"))).to_be_visible()
        truth = {r["state"]: r["label"] for r in later}
        for n in range(2):  # the first ranked row each time, labeled with its true label
            head = page.locator("[data-testid=stMarkdown]").filter(has_text=re.compile(r"^1\. line \d+")).first
            line = int(re.search(r"line (\d+)", head.inner_text()).group(1))
            state = later[line - 2]["state"]  # line 1 is the CSV header
            option = ["yes", "no"].index(truth[state])
            page.locator(f".st-key-rv_pool_label_{line}_{option} button").click()
            expect(page.get_by_text(re.compile(rf"open pool rows to label next \({n + 1} already labeled"))).to_be_visible()
            settle(page)  # the rerun's end: until then the rows drawn before it may stand beside the new ones
        page.get_by_role("button", name="Add 2 labels as a new version of set #1").click()
        settle(page)
        expect(page.get_by_text(re.compile(r"Set #2 = set #1 \+ 2 reviewed rows"))).to_be_visible()
        added = [r for r in store.labeled_rows(2) if r["row_key"].startswith("review-")]
        assert len(added) == 2 and all(truth[r["state"]] == r["label"] for r in added)
        assert len(store.labeled_rows(1)) == N_SEED + 8  # the parent version is unchanged

        nav(page, "Calibrate")
        choose(page, "Labeled set", "+2 reviewed")
        page.get_by_role("button", name=re.compile(rf"^Run evaluation \({N_SEED + 2} rows")).click()
        expect(page.get_by_text(re.compile(rf"{N_SEED + 2} rows scored now: {N_SEED + 2} copied from stored results of "
                                           r"the same model and request, 0 evaluated"))).to_be_visible(timeout=300_000)
        settle(page, timeout=300_000)
        page.get_by_role("button", name="Save for deployment").click()
        settle(page)
        page.get_by_text("Deploy packages it").wait_for()

        nav(page, "Deploy")
        page.get_by_role("radiogroup", name="Compute").get_by_text("GPU instance pool").click()
        settle(page)
        page.get_by_label("S3 bucket for model.tar.gz").fill("my-models")
        page.get_by_label("SageMaker execution role ARN").fill("arn:aws:iam::123456789012:role/sm")
        page.get_by_label("CodeBuild service role ARN (SemIf path)").fill("arn:aws:iam::123456789012:role/cb")
        page.get_by_role("button", name="Plan", exact=True).click()
        settle(page, timeout=300_000)
        page.get_by_text("depending on which pool wins").wait_for(timeout=300_000)  # packaged, then planned
        newest = store.list_calibrated()[0]
        assert newest["config"]["dataset"]["content_hash"] == store.get_labeled_set(2)["content_hash"]
    finally:
        ctx.close()
        proc.terminate()
        proc.wait(20)


def test_pool_scoring_goes_on_while_the_analyst_is_on_another_page(browser, tmp_path):  # noqa: F811
    """Scoring a pool is a background task like an evaluation: it waits on the worker behind a running evaluation,
    other pages show it in the background panel, and back on Review the panel is open on the pool, showing the
    scoring's progress or how it ended, then the ranking. Before, the scoring ran in the page's own script run:
    no background task, and leaving the page ended it. (An evaluation of every other shipped row runs in front, so
    the pool's 10 rows wait while the analyst leaves the page - it is stopped from History.)"""
    from app.core.labeled import import_file
    from app.core.store import Store
    from app.service import pool as pools

    db, cal, _ = calibrate_cli(tmp_path, "refund-check", N_SEED, "--head", "none")
    store = Store(db)
    store.save_calibrated(json.loads(cal.read_text()))
    rows = [json.loads(l) for l in (ROOT / "data" / "labeled" / "refund-check.jsonl").read_text().splitlines() if l]
    test_rows = [r for r in rows if r.get("split") != "train"]
    later = test_rows[N_SEED: N_SEED + N_POOL]
    file = tmp_path / "pool.jsonl"
    file.write_text("".join(json.dumps({"id": f"p{i}", "state": r["state"]}) + "\n" for i, r in enumerate(later)))
    policy = store.get_policy("refund-check")
    made = pools.import_file(store, policy, str(file), into_set=1)
    # the evaluation in front: every shipped row outside the seed and the pool (it is stopped from History, so
    # its length costs nothing; the longer it is, the surer it still runs while the analyst moves on)
    taken = {r["state"] for r in test_rows[: N_SEED + N_POOL]}
    big = import_file(store, "big.jsonl", "".join(json.dumps(r) + "\n" for r in rows if r["state"] not in taken).encode(),
                      policy)
    url, proc = start_workbench(db)
    ctx = browser.new_context(viewport={"width": 1400, "height": 3000})
    page = ctx.new_page()
    try:
        page.goto(f"{url}/calibrate?policy=refund-check&set={big}")
        settle(page)
        page.get_by_role("button", name=re.compile(r"^Run evaluation")).click()
        expect(page.get_by_text("Running in the background")).to_be_visible(timeout=60_000)
        nav(page, "Review queue")
        page.get_by_text("Label from a pool of unlabeled states").click()
        settle(page)
        page.get_by_role("button", name="Score the pool").click()
        expect(page.get_by_text(re.compile(rf"Scoring pool #{made.pool_id} with candidate #\d+ in the background"))
               ).to_be_visible(timeout=120_000)
        expect(page.get_by_text(re.compile(rf"scoring pool #{made.pool_id} \({N_POOL} rows\).*: waiting for the task "
                                           "before it")).first).to_be_visible()
        nav(page, "History")  # leave while it waits: every page shows it
        expect(page.get_by_text(re.compile(rf"scoring pool #{made.pool_id} \({N_POOL} rows\)")).first).to_be_visible()
        page.get_by_role("button", name="Stop", exact=True).first.click()  # the evaluation's: the pool's turn
        settle(page)
        page.screenshot(path=str(tmp_path / "pool-away.png"), full_page=True)
        nav(page, "Review queue")  # the panel is open on the pool again: its progress, then how it ended
        expect(page.get_by_text(f"Scored: {N_POOL} pool rows: 0 stored scores reused")).to_be_visible(timeout=300_000)
        expect(page.get_by_text(re.compile(rf"^10 of {N_POOL} open pool rows to label next"))).to_be_visible()
        run = next(r for r in store.list_runs(kind="pool"))
        assert run["status"] == "done" and len(store.results(run["id"])) == N_POOL  # not interrupted by leaving
        assert next(r for r in store.list_runs(kind="eval") if r["labeled_set_id"] == big)["status"] == "stopped"
    finally:
        ctx.close()
        proc.terminate()
        proc.wait(20)
