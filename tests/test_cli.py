"""`python -m adapter score` as a process: JSONL in, JSONL out, progress on stderr."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT, routing_row


def run_score(tmp_path, lines: list[str], *args):
    src = tmp_path / "rows.jsonl"
    src.write_text("\n".join(lines) + "\n")
    return subprocess.run([sys.executable, "-m", "adapter", "score", str(src), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_score_rows_and_shared_state(tmp_path):
    row = routing_row("The parcel never arrived", "p1")
    shared = {"state": "Login fails with error 500 since the update",
              "questions": [{"id": "q1", "question": row["question"], "options": row["options"]},
                            {"id": "q2", "question": "Is it urgent?", "options": [{"id": "yes"}, {"id": "no"}]}]}
    proc = run_score(tmp_path, [json.dumps(row), json.dumps(shared)], "--readout", "letters")
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["id"] for r in out] == ["p1", "q1", "q2"]
    assert all(r["readout"] == "letters" for r in out)
    assert "3/3" in proc.stderr  # tqdm progress bar with counts


def test_bad_rows_are_reported_by_line_and_nothing_is_scored(tmp_path):
    good = json.dumps(routing_row("fine", "ok"))
    bad = json.dumps({**routing_row("x", "bad"), "options": [{"id": "only"}]})
    proc = run_score(tmp_path, [good, "{broken", bad])
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "line 2: not valid JSON" in proc.stderr and "line 3: options" in proc.stderr
