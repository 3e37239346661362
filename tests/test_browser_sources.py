"""Head-layout sources scored without thrashing, in Debian chromium (issue 43, item 1 - the "cold rows" of its
*Done when*): an analyst on Calibrate evaluates a policy on a local model with another local model as a
head-layout source, while the workbench keeps only one model loaded (SEMIF_MAX_LOADED_MODELS=1, fewer than the
evaluation uses). Before the fix every row of both runs was stored cold (a model reloaded on every row) and the
comparison's seconds, tokens and $ columns were empty; now each run has exactly one cold row (its first) and the
comparison the page downloads has every cost filled."""
from __future__ import annotations

import csv
import io
import re
import time

import pytest
from playwright.sync_api import expect

from adapter.engine.templates import load_template
from app.core.labeled import import_file
from app.core.store import Store
from tests.conftest import subset_file
from tests.test_browser import browser, settle, shot_dir, start_workbench  # noqa: F401 (fixture)

pytestmark = [pytest.mark.browser]
ROWS = 12


def test_sources_beyond_the_pool_are_scored_warm_and_priced_in_the_browser(browser, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("SEMIF_MAX_LOADED_MODELS", "1")
    db = tmp_path / "wb.db"
    store = Store(db)
    policy = load_template("refund-check")
    store.save_policy(policy)
    sid = import_file(store, f"refund-{ROWS}.jsonl", subset_file(tmp_path, "refund-check", ROWS, n_train=0).read_bytes(),
                      policy)
    url, proc = start_workbench(db)
    ctx = browser.new_context(viewport={"width": 1400, "height": 3200}, accept_downloads=True)
    page = ctx.new_page()
    shots = shot_dir(tmp_path)
    try:
        page.goto(f"{url}/calibrate?policy=refund-check&set={sid}")
        settle(page)
        # the multiselect itself (its help icon carries the same label)
        page.locator("[data-testid=stMultiSelect]").filter(has_text="Head layout").locator("input").click()
        page.get_by_role("option", name=re.compile("qwen2.5-coder-0.5b")).first.click()
        page.keyboard.press("Escape")
        settle(page)
        expect(page.get_by_text(re.compile(r"for 2 sources"))).to_be_visible()  # the estimate counts the source
        expect(page.get_by_text(re.compile(r"SEMIF_MAX_LOADED_MODELS"))).to_be_visible()  # more models than the pool
        page.get_by_role("button", name=re.compile(r"^Run evaluation")).click()
        deadline = time.time() + 900
        while time.time() < deadline:  # the page runs it in the background; the store says when it is over
            made = store.list_runs(kind="eval")
            if len(made) == 2 and all(r["status"] not in ("running",) for r in made):
                break
            time.sleep(2)
        made = store.list_runs(kind="eval")
        assert len(made) == 2 and {r["status"] for r in made} == {"done"}, [(r["id"], r["status"]) for r in made]
        for run in made:
            results = store.results(run["id"])
            assert len(results) == ROWS and not any(r["error"] for r in results)
            # before: every row cold (the pool of one reloaded a model on every row); now the first only
            assert [int(r["cold"]) for r in results].count(1) == 1, (run["id"], [r["cold"] for r in results])
        page.reload()
        settle(page)
        heading = page.get_by_text("Cheapest decision that is not worse")
        expect(heading).to_be_visible(timeout=300_000)
        heading.scroll_into_view_if_needed()
        page.screenshot(path=str(shots / "sources-table.png"), full_page=True)
        with page.expect_download() as got:
            page.get_by_role("button", name="Download the sources compared (CSV)").click()
        rows = list(csv.DictReader(io.StringIO(open(got.value.path(), encoding="utf-8-sig").read())))
        assert {r["layout"] for r in rows} == {"state first", "head layout (policy first)"}, rows
        columns = list(rows[0])
        assert columns.index("s a row (measured)") < 6 and columns.index("accuracy (out of fold)") < 3, columns
        for r in rows:  # every candidate's cost measured: seconds, tokens and $ per 1,000
            assert r["s a row (measured)"] and float(r["s a row (measured)"]) > 0, r
            assert r["tokens a row"] and float(r["tokens a row"]) > 0, r
            assert any(k.startswith("$") and r[k] for k in r), r
    finally:
        ctx.close()
        proc.terminate()
        proc.wait(20)
