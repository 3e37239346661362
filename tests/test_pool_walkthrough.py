"""From an unlabeled pool to a served gated policy (issue 44, "Done when"), small enough for CI: the shipped
135M model, a 12-row seed set and a 16-state pool of the refund-check policy. On the command line: the pool
imported, scored once and kept (the second suggestion scores nothing), labels added as a new set version,
the next calibration copying every stored score (0 rows evaluated), the exported file served by the adapter
deciding the pool's rows with its gate. On the Review page (AppTest, the real model in process): the pool
scored with a saved calibrated policy, ranked, a row labeled and added to the set as a new version.
The full 300-state walkthrough was run by hand (docs/review.md, "A pool of unlabeled states")."""
from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys

import httpx
import pytest
from streamlit.testing.v1 import AppTest

from app.core import pool_store
from app.core.store import Store
from tests.conftest import ROOT, ServerProcess, calibrate_cli, finish_tasks

MAIN = str(ROOT / "app" / "main.py")
N_SEED, N_POOL = 12, 16
RANKED = re.compile(r"^\s*\d+\. line \d+ \[")


def captions(at: AppTest) -> list[str]:
    return [c.value.replace("\\", "") for c in at.caption]  # as read: without the markdown escapes


def app(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """A refund-check calibration on 12 labeled rows, and a pool file of the next 16 states (their labels
    kept aside: the analyst's answers)."""
    tmp = tmp_path_factory.mktemp("walk")
    db, cal, _ = calibrate_cli(tmp, "refund-check", N_SEED, "--head", "none")
    for name in ("page.db", "agree.db", "stop.db"):  # the page test's and the agreement test's own copies, as calibrated
        with sqlite3.connect(db) as src, sqlite3.connect(tmp / name) as copy:
            src.backup(copy)
    rows = [json.loads(l) for l in (ROOT / "data" / "labeled" / "refund-check.jsonl").read_text().splitlines() if l]
    later = [r for r in rows if r.get("split") != "train"][N_SEED: N_SEED + N_POOL]
    pool = tmp / "pool.jsonl"
    pool.write_text("".join(json.dumps({"id": f"p-{i}", "state": r["state"]}) + "\n" for i, r in enumerate(later)))
    truth = {f"p-{i}": r["label"] for i, r in enumerate(later)}
    return tmp, db, cal, pool, truth


def test_the_command_line_walkthrough_reuses_every_stored_score(seeded):
    tmp, db, cal, pool, truth = seeded
    got = app("pool", "import", "--db", str(db), "--policy", "refund-check", "--file", str(pool), "--labeled-set", "1")
    assert got.returncode == 0, got.stderr
    pid = int(got.stdout.split("pool #")[1].split(":")[0])
    assert f"{N_POOL} unlabeled rows kept" in got.stdout

    first = app("suggest", "--db", str(db), "--quiet", "--policy", str(cal), "--pool", str(pid), "--k", "4",
                "--labeled-set", "1")
    assert first.returncode == 0, first.stderr
    assert f"{N_POOL} pool rows: 0 stored scores reused" in first.stderr and f"{N_POOL} scored now" in first.stderr
    again = app("suggest", "--db", str(db), "--quiet", "--policy", str(cal), "--pool", f"#{pid}", "--k", "4",
                "--labeled-set", "1")
    assert again.returncode == 0, again.stderr
    assert f"{N_POOL} stored scores reused, 0 copied from stored results of the same model and request, 0 scored now" \
        in again.stderr
    ranked = [l for l in again.stdout.splitlines() if RANKED.match(l)]
    assert ranked == [l for l in first.stdout.splitlines() if RANKED.match(l)]
    picked = [l.split("[")[1].split("]")[0] for l in ranked]
    assert len(picked) == 4 and len(set(picked)) == 4, again.stdout
    # the default random share (0.25 of 4: 1 row) drawn at random, marked, the same on both runs
    drawn = [l.split("[")[1].split("]")[0] for l in ranked if "] (random draw) margin" in l]
    assert len(drawn) == 1 and "1 of them drawn at random" in again.stdout, again.stdout

    bad = tmp / "bad.jsonl"
    bad.write_text(json.dumps({"id": picked[0], "label": truth[picked[0]]}) + "\n"
                   + json.dumps({"id": picked[1], "label": "maybe"}) + "\n")
    refused = app("pool", "label", "--db", str(db), "--policy", str(cal), "--pool", str(pid), "--labels", str(bad),
                  "--labeled-set", "1", "--who", "ana")
    assert refused.returncode == 2 and f"row '{picked[1]}': label 'maybe' is not an option" in refused.stderr
    assert Store(db).reviews("refund-check") == []  # nothing stored from the refused file

    labels = tmp / "labels.jsonl"
    labels.write_text("".join(json.dumps({"id": i, "label": truth[i]}) + "\n" for i in picked))
    added = app("pool", "label", "--db", str(db), "--policy", str(cal), "--pool", str(pid), "--labels", str(labels),
                "--labeled-set", "1", "--who", "ana")
    assert added.returncode == 0, added.stderr
    assert "(1 of them drawn at random, kept as random draws)" in added.stdout  # k: the 4 rows of the file
    new_set = int(added.stdout.split("new set: ")[1])
    store = Store(db)
    assert len(store.labeled_rows(1)) == N_SEED + 8 and len(store.labeled_rows(new_set)) == N_SEED + 8 + 4
    moved = {r["state"]: r["label"] for r in store.labeled_rows(new_set) if r["row_key"].startswith("review-")}
    states = {json.loads(l)["id"]: json.loads(l)["state"] for l in pool.read_text().splitlines()}
    assert moved == {states[i]: truth[i] for i in picked}
    how = {r["state"]: r["meta"]["picked"] for r in store.labeled_rows(new_set) if r["row_key"].startswith("review-")}
    assert how == {states[i]: "random draw" if i in drawn else "suggested" for i in picked}

    final = tmp / "final.json"
    cal2 = app("calibrate", "--db", str(db), "--quiet", "--policy", "refund-check", "--labeled-set", str(new_set),
               "--head", "none", "--gate", "0.6", "--out", str(final))
    assert cal2.returncode == 0, cal2.stderr
    assert f"scored {N_SEED + 4} rows (0 evaluated, {N_SEED + 4} copied from stored results" in cal2.stderr
    # the gate checked on the one drawn row alone, beside the gate: printed, and kept in the export's notes
    check = next(l for l in cal2.stdout.splitlines() if l.startswith("The unbiased check, on the pool's random sample ("))
    assert "(1 labeled row, drawn at random)" in check or ": 1 drawn at random, " in check  # the drawn row is in it
    assert "at this gate (confidence >= 0.600, out of fold)" in check and "small (under 30 rows under the bound)" in check
    assert check in json.loads(final.read_text())["metrics"]["gate_notes"]

    after = app("suggest", "--db", str(db), "--quiet", "--policy", str(final), "--pool", str(pid), "--k", "4",
                "--labeled-set", str(new_set))
    assert after.returncode == 0, after.stderr
    assert f"{N_POOL} copied from stored results of the same model and request, 0 scored now" in after.stderr
    assert f"of {N_POOL - 4} open pool rows to label next (4 already labeled and moved to the set)" in after.stdout

    for args, says in ((["suggest", "--policy", str(final), "--pool", "99"], "pool #99: no such pool"),
                       (["pool", "import", "--policy", "ticket-routing", "--file", str(tmp / "nothing.jsonl")],
                        "nothing.jsonl: cannot read it")):
        out = app(*args, "--db", str(db))
        assert out.returncode == 2 and says in out.stderr, out.stderr

    srv = ServerProcess([sys.executable, "-m", "adapter", "serve", "--host", "127.0.0.1", "--port", "0"],
                        env={"SM_SEMIF_POLICY": str(final)})
    try:
        rows = [{"id": i, "state": s, "policy_id": "refund-check"} for i, s in states.items()]
        served = httpx.post(srv.url + "/invocations", json=rows, timeout=600).json()
    finally:
        srv.stop()
    policy = json.loads(final.read_text())
    assert policy["threshold"] == 0.6 and policy["gate_source"] == "hand-set"
    for s in served:
        d = s["decision"]
        assert d["gated"] == (d["option_id"] == policy["fallback_option"])
        assert (d["confidence"] >= 0.6) == (not d["gated"]) or d["reason"] != "confidence", d  # the gate, as set
    assert len(served) == N_POOL


def test_a_pool_file_and_the_same_rows_stored_are_ranked_alike(seeded):
    """`suggest --pool FILE` and `--pool N` (the file imported): the same requests, label counts and labeled rows'
    hidden states, so the same rows in the same order - with --labeled-set and without. Measured before (main at
    3187cb8, these 16 rows, k=8): without --labeled-set they differed - the stored pool counted zero labels per
    option and began with the cold start's representative rows (p6 p12 p1 p3 ...), the file passed no counts and
    ranked by margin alone (p6 p15 p5 p4 ...)."""
    tmp, _, cal, pool, truth = seeded
    db = tmp / "agree.db"
    got = app("pool", "import", "--db", str(db), "--policy", "refund-check", "--file", str(pool), "--labeled-set", "1")
    assert got.returncode == 0, got.stderr
    pid = int(got.stdout.split("pool #")[1].split(":")[0])
    for labeled in ([], ["--labeled-set", "1"]):
        lists = []
        for which in (str(pool), str(pid)):
            out = app("suggest", "--db", str(db), "--quiet", "--policy", str(cal), "--pool", which, "--k", "8", *labeled)
            assert out.returncode == 0, out.stderr
            lists.append([l.split("]")[0] + "]" for l in out.stdout.splitlines() if RANKED.match(l)])
        assert len(lists[0]) == 8 and lists[0] == lists[1], (labeled, lists)
    # pool rows labeled (a new set version): both still compare with the same labeled rows' hidden states - every
    # pool run of the candidate is read, whichever path ranks (before, only `--pool N` read the pool's own run)
    first_two = [l.split("[")[1].split("]")[0] for l in lists[0][:2]]
    labels = tmp / "agree-labels.jsonl"
    labels.write_text("".join(json.dumps({"id": i, "label": truth[i]}) + "\n" for i in first_two))
    added = app("pool", "label", "--db", str(db), "--policy", str(cal), "--pool", str(pid), "--labels", str(labels),
                "--labeled-set", "1", "--who", "ana")
    assert added.returncode == 0, added.stderr
    new_set = added.stdout.split("new set: ")[1].strip()
    lists = []
    for which in (str(pool), str(pid)):
        out = app("suggest", "--db", str(db), "--quiet", "--policy", str(cal), "--pool", which, "--k", "8",
                  "--labeled-set", new_set)
        assert out.returncode == 0, out.stderr
        lists.append([l.split("]")[0] + "]" for l in out.stdout.splitlines() if RANKED.match(l)])
    assert len(lists[0]) == 8 and lists[0] == lists[1], lists
    assert not {l.split("[")[1] for l in lists[0]} & {f"{i}]" for i in first_two}  # the labeled rows left the pool
    from app.service import pool as pools, suggest as sg

    store = Store(db)  # the file's path reads them too: the seed's 12 evaluated rows and the 2 labeled pool rows'
    seen = pools.labeled_vectors(store, pools.candidate(store, sg.load(str(cal))), int(new_set))  # (was 12 of 22)
    assert (seen.found, seen.labeled) == (N_SEED + 2, N_SEED + 8 + 2), seen.text


def test_the_review_page_scores_ranks_and_labels_a_pool(seeded, monkeypatch):
    tmp, db, cal, pool, truth = seeded
    store = Store(tmp / "page.db")  # the calibration's database as it was before the command-line test
    saved = json.loads(cal.read_text())
    store.save_calibrated(saved)  # the calibrated policy saved for Deploy: it names its evaluation run
    set_id = 1
    from app.service import pool as pools

    got = pools.import_file(store, store.get_policy("refund-check"), str(pool), into_set=set_id)
    monkeypatch.setenv("SEMIF_DB", str(tmp / "page.db"))
    at = AppTest.from_file(MAIN, default_timeout=600)
    at.run()
    at.switch_page("views/review.py").run()
    at.checkbox(key="rv_pool_open").check().run()
    assert not at.exception, at.exception
    assert any("Not scored yet" in c for c in captions(at))
    at.button(key="rv_pool_score").click().run()  # a background task: the page says so, the ranking comes after
    assert not at.exception, at.exception
    # its progress, or - where the machine scored the 16 rows before the page's rerun got there - how it ended
    assert any(f"Scoring pool #{got.pool_id} with candidate" in c or f"{N_POOL} pool rows: 0 stored scores reused" in c
               for c in captions(at)), captions(at)
    finish_tasks(at)
    assert not at.exception, at.exception
    assert any(f"{N_POOL} pool rows: 0 stored scores reused" in c and f"{N_POOL} scored now" in c
               for c in captions(at)), captions(at)
    done = at.button(key="rv_pool_score")  # said as it is: nothing left to score (it said "Score the rows not scored yet")
    assert done.label == f"All {N_POOL} rows are scored" and done.disabled
    # the set's 12 evaluated rows have hidden states stored by the calibration's run (its 8 train rows do not)
    assert any(f"10 of {N_POOL} open pool rows to label next" in c and "compared with the stored hidden states of "
               f"{N_SEED} of {N_SEED + 8} labeled rows" in c for c in captions(at)), captions(at)
    first = next(m.value for m in at.markdown if m.value.startswith("**1.** line "))
    line = int(first.split("line ")[1].split(" ")[0])
    row_id = first.split("`")[1]
    assert row_id.startswith("p-"), first  # the file's id as it is (a markdown escape showed as "p\\-3" in code)
    at.button(key=f"rv_pool_label_{line}_0").click().run()  # option 0: yes
    assert not at.exception, at.exception
    (label,) = store.reviews("refund-check", pending=True)
    assert (label["label"], label["action"], label["row_key"]) == ("yes", "label", f"line-{line}")
    assert any(f"10 of {N_POOL - 1} open pool rows to label next (1 already labeled" in c and "hidden states of "
               f"{N_SEED + 1} of {N_SEED + 9} labeled rows" in c for c in captions(at)), captions(at)  # the pool row's too
    at.button(key="rv_append").click().run()
    assert not at.exception, at.exception
    newest = max(s["id"] for s in store.list_labeled_sets())
    added = [r for r in store.labeled_rows(newest) if r["row_key"].startswith("review-")]
    states = {json.loads(l)["id"]: json.loads(l)["state"] for l in pool.read_text().splitlines()}
    assert [(r["state"], r["label"]) for r in added] == [(states[row_id], "yes")]
    assert len(store.labeled_rows(set_id)) == N_SEED + 8  # the parent version is unchanged
    assert got.pool_id == pool_store.pools(store)[0].id

    # the scoring's note belongs to the pool it scored: another pool shows none (it said the first pool's before)
    rows = [json.loads(l) for l in (ROOT / "data" / "labeled" / "refund-check.jsonl").read_text().splitlines() if l]
    other_file = tmp / "other.jsonl"
    other_file.write_text("".join(json.dumps({"state": r["state"]}) + "\n" for r in
                                  [r for r in rows if r.get("split") != "train"][N_SEED + N_POOL: N_SEED + N_POOL + 3]))
    other = pools.import_file(store, store.get_policy("refund-check"), str(other_file), into_set=newest)
    at.run()
    at.selectbox(key="rv_pool").select(other.pool_id).run()
    assert not at.exception, at.exception
    assert not any("Scored:" in c for c in captions(at)) and any("Not scored yet" in c for c in captions(at))
    at.selectbox(key="rv_pool").select(got.pool_id).run()
    assert any(f"Scored: {N_POOL} pool rows" in c for c in captions(at)), captions(at)
    # a scoring the worker no longer keeps (it keeps the last 20 finished tasks): said as over, not lost in silence
    from app.ui.pool_panel import SCORING  # the panel's declared task keys

    at.session_state[SCORING.task] = 10_000
    at.session_state[SCORING.planned] = {"pool": other.pool_id, "candidate": at.selectbox(key="rv_pool_candidate").value}
    at.selectbox(key="rv_pool").select(other.pool_id).run()
    assert any("The scoring ended while you were away" in c for c in captions(at)), captions(at)
    assert SCORING.planned not in at.session_state


def test_pool_scoring_on_the_page_stops_when_asked_and_resumes(seeded, monkeypatch):
    """The page's scoring is a background task: Stop (here asked after the third row, as the Stop button asks)
    keeps the rows scored and says so; scoring again scores only the rest."""
    from app.service import pool as pools

    tmp, _, cal, pool, _ = seeded
    store = Store(tmp / "stop.db")
    store.save_calibrated(json.loads(cal.read_text()))
    made = pools.import_file(store, store.get_policy("refund-check"), str(pool), into_set=1)
    real = pools.score

    def stopped_after_three(db, p, cand, target, progress=None):
        task = progress.__self__  # the page hands the task's own progress: Stop is asked there

        def report(done, total, eta):
            if done >= 3:
                task.stop()
            progress(done, total, eta)

        return real(db, p, cand, target, report)

    monkeypatch.setattr(pools, "score", stopped_after_three)
    monkeypatch.setenv("SEMIF_DB", str(tmp / "stop.db"))
    at = AppTest.from_file(MAIN, default_timeout=600)
    at.run()
    at.switch_page("views/review.py").run()
    at.checkbox(key="rv_pool_open").check().run()
    at.button(key="rv_pool_score").click().run()
    finish_tasks(at)
    assert not at.exception, at.exception
    infos = [i.value.replace("\\", "") for i in at.info]  # as read: without the markdown escapes
    assert any(f"Scoring stopped at 3/{N_POOL} rows" in i for i in infos), infos
    (run,) = store.list_runs(kind="pool")
    assert run["status"] == "stopped" and len(store.results(run["id"])) == 3
    assert any(f"3 of {N_POOL} open pool rows to label next" in c for c in captions(at)), captions(at)
    monkeypatch.setattr(pools, "score", real)
    assert at.button(key="rv_pool_score").label == f"Score the {N_POOL - 3} rows not scored yet"
    at.button(key="rv_pool_score").click().run()
    finish_tasks(at)
    assert any(f"Scored: {N_POOL} pool rows: 3 stored scores reused" in c and f"{N_POOL - 3} scored now" in c
               for c in captions(at)), captions(at)
    assert made.pool_id == run["config"]["pool_id"]
