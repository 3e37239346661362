"""A pool of unlabeled states and the next rows to label (issue 44, items 5 and 7): bad input is named by
line and left out (nothing else lost), a huge pool is read up to a cap and says so, and `python -m app
suggest` ranks a real pool under a calibrated policy."""
from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np

from app.core import pool, suggest
from tests.conftest import ROOT, calibrate_cli


def test_every_bad_row_is_named_by_its_line():
    lines = [{"state": "ok one"}, {"state": "  "}, {"state": "ok one"}, {"state": "in the set"},
             {"state": "x", "label": "maybe"}, {"state": "y", "policy_id": "other"}, "not json", {"state": {"a": 1}}]
    text = "\n".join(l if isinstance(l, str) else json.dumps(l) for l in lines) + "\n"
    got = pool.read_pool(io.StringIO(text), "p.jsonl", ["yes", "no"], "refund-check", known={"in the set"})
    assert [r.line for r in got.rows] == [1, 8]
    assert got.problems == ["line 2: the state is empty", "line 3: the same state as line 1 ('ok one')",
                            "line 4: this state is already in the labeled set",
                            "line 5: label 'maybe' is not an option (yes, no)",
                            "line 6: a row of policy 'other', not 'refund-check'",
                            "line 7: not valid JSON (Expecting value)"]
    csv_no_state = pool.read_pool(io.StringIO("text\nhello\n"), "p.csv", ["yes", "no"], "p")
    assert csv_no_state.problems == ["line 1: no 'state' column; found ['text']"] and not csv_no_state.rows


def test_a_huge_pool_is_streamed_up_to_the_cap():
    def lines():  # a million rows, generated as they are read: never held in memory
        for i in range(1_000_000):
            yield json.dumps({"state": f"row {i}"}) + "\n"

    class Stream(io.TextIOBase):
        def __init__(self):
            self.it = lines()

        def __iter__(self):
            return self.it

    got = pool.read_pool(Stream(), "big.jsonl", ["a", "b"], "p", cap=1000)
    assert len(got.rows) == 1000 and "more than 1,000 rows" in got.capped and "line 1001" in got.capped


def test_suggestions_are_the_least_sure_without_near_duplicates():
    P = np.array([[0.5, 0.5], [0.51, 0.49], [0.9, 0.1], [0.7, 0.3]])
    X = np.array([[1, 0], [1, 0.001], [0, 1], [0.5, 0.5]], float)  # rows 0 and 1 are the same state vector
    assert suggest.rank(P, k=2) == [0, 1]
    assert suggest.rank(P, k=2, X=X) == [0, 3]
    # an option with fewer than 2 labels: its most typical row first
    assert suggest.rank(P, k=1, counts=[5, 0]) == [0] and suggest.rank(np.array([[0.2, 0.8], [0.4, 0.6], [0.5, 0.5]]),
                                                                        k=1, counts=[5, 1]) == [0]


def test_a_big_labeled_set_is_sampled_for_the_cold_start(monkeypatch):
    """k-means runs labeled + k clusters on every Review rerun: 2,000 labeled vectors are sampled to LABELED_CAP
    (seeded, so the same ranking twice), not clustered whole."""
    rng = np.random.default_rng(1)
    P, X, L = rng.dirichlet([1, 1, 1], 60), rng.normal(size=(60, 16)), rng.normal(size=(2000, 16))
    seen = []
    real = suggest.KMeans

    def counting(n_clusters, **kw):
        seen.append(n_clusters)
        return real(n_clusters=n_clusters, **kw)

    monkeypatch.setattr(suggest, "KMeans", counting)
    first = suggest.rank(P, k=5, X=X, counts=[0, 3, 3], labeled_X=L)
    assert seen == [suggest.LABELED_CAP + 5] and len(first) == 5
    assert suggest.rank(P, k=5, X=X, counts=[0, 3, 3], labeled_X=L) == first


def test_app_suggest_ranks_a_pool_under_a_calibrated_policy(tmp_path):
    db, policy_file, _ = calibrate_cli(tmp_path, "refund-check", 12, "--head", "none")
    states = ["Bought shoes 3 days ago, unworn, want my money back.", "Laptop died after 2 months.", "",
              "Bought shoes 3 days ago, unworn, want my money back.", "Opened the software box, changed my mind."]
    (tmp_path / "pool.jsonl").write_text("".join(json.dumps({"state": s}) + "\n" for s in states))
    proc = subprocess.run([sys.executable, "-m", "app", "suggest", "--db", str(db), "--policy", str(policy_file),
                           "--pool", str(tmp_path / "pool.jsonl"), "--k", "2"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "line 3: the state is empty" in proc.stderr and "line 4: the same state as line 1" in proc.stderr
    ranked = [l for l in proc.stdout.splitlines() if l.lstrip()[:2] in ("1.", "2.")]
    assert len(ranked) == 2 and "label these 2 of 3 rows next" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "app", "suggest", "--db", str(db), "--policy", str(policy_file),
                          "--pool", str(tmp_path / "missing.jsonl")], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "--pool" in bad.stderr and "missing.jsonl" in bad.stderr


def test_the_ranking_line_says_labels_not_yet_added_are_not_in_the_set():
    """The 300-state walk read '20 of 260 open pool rows to label next (40 already labeled and moved to the set)'
    right under '40 labels given, not yet added to a set': the labels were pending. The line now says which."""
    from app.service.pool import Ranking

    waiting = Ranking([], 260, 40, 260, [], None, 40).text
    assert waiting.startswith("0 of 260 open pool rows to label next (40 already labeled, 40 of them not yet added "
                              "to the set); ranked from 260 stored scores"), waiting
    assert "(44 already labeled, 4 of them not yet added to the set, 40 in it)" in Ranking([], 256, 44, 256, [], None, 4).text
    assert "(40 already labeled and moved to the set)" in Ranking([], 260, 40, 260, []).text
