"""Benchmark tables are written by the bench scripts (bench/report.py), never by hand: every block of
docs/benchmarks.md belongs to a script that publishes it, a publish replaces only its own block, and
the scripts' table builders give markdown tables from their records."""
from __future__ import annotations

import re

from bench import guard as guard_bench
from bench import models as models_bench
from bench.report import BENCHMARKS, HEADER, publish
from tests.conftest import ROOT

BLOCK = re.compile(r"<!-- bench:(\w+) -->\n## `python -m bench\.(\w+)`\n\n_measured [^\n]+_\n\n.*?<!-- /bench:(\w+) -->", re.S)


def test_every_block_in_the_benchmarks_page_is_written_by_its_script():
    text = BENCHMARKS.read_text()
    assert text.startswith(HEADER)
    blocks = BLOCK.findall(text)
    names = [b[0] for b in blocks]
    assert len(set(names)) == len(names), names  # one block per script
    publishing = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if re.search(r'publish\("\w+"', p.read_text()))
    assert sorted(names) == publishing  # every script that publishes has its block, and no other block
    assert text.count("<!-- bench:") == len(blocks)  # no block outside the format publish writes
    for name, heading, end in blocks:
        assert name == heading == end
        script = (ROOT / "bench" / f"{name}.py").read_text()
        assert f'publish("{name}"' in script, f"bench/{name}.py does not publish its block"
        assert '"--no-publish"' in script


def test_publish_replaces_its_own_block_and_keeps_the_rest(tmp_path):
    page = tmp_path / "benchmarks.md"
    publish("engine", "| a | b |\n|---|---|\n| 1 | 2 |", path=page)
    assert page.read_text().startswith(HEADER) and "| 1 | 2 |" in page.read_text()
    page.write_text(page.read_text() + "\nprose written between blocks\n")
    publish("speed", "speed table", path=page, note="a note")
    publish("engine", "| a | b |\n|---|---|\n| 3 | 4 |", path=page)
    text = page.read_text()
    assert "| 1 | 2 |" not in text and "| 3 | 4 |" in text and "speed table" in text
    assert "prose written between blocks" in text and text.count("<!-- bench:engine -->") == 1
    assert text.index("bench:engine") < text.index("prose written") < text.index("bench:speed")  # in place
    assert re.search(r"_measured \d{4}-\d{2}-\d{2} on \d+ CPU\(s\), [^;]+; a note_", text)


def test_the_model_table_counts_accuracy_seconds_and_positions_from_the_records(monkeypatch):
    done = {("m", "letters", "set-a", "r1"): {"top": "x", "label": "x", "seconds": 1.0, "position": 0},
            ("m", "letters", "set-a", "r2"): {"top": "y", "label": "x", "seconds": 3.0, "position": 1},
            ("m", "letters", "set-b", "r3"): {"top": "z", "label": "z", "seconds": 2.0, "position": 2}}
    sets = {"set-a": [{"id": "r1"}, {"id": "r2"}], "set-b": [{"id": "r3"}]}
    monkeypatch.setattr(models_bench, "SHIPPED", {"m": type("Shipped", (), {"title": "Model M"})()})
    table = models_bench.report(done, sets, ["m"], ["letters"]).splitlines()
    assert table[0] == "| model | readout + debias | set-a | set-b | all | s/decision | chosen positions |"
    assert table[2] == "| Model M | letters | 50% (2) | 100% (1) | **66.7%** | 2.00 | 1/1/1/0 |"


def test_the_guard_table_says_what_was_held_and_flagged():
    base = dict(set="s", pieces=2, precheck=False, erase=None, passes=1, decision_seconds=1.0)
    recs = [{**base, "key": "a", "kind": "base", "label": "x", "top": "x", "named": None, "guard": False},
            {**base, "key": "b", "kind": "base", "label": "y", "top": "y", "named": None, "guard": True},
            {**base, "key": "a#rb:steering:t~y~id", "kind": "steering", "label": "x", "top": "y", "named": "y",
             "guard": True},
            {**base, "key": "b#rb:steering:t~x~id", "kind": "steering", "label": "y", "top": "x", "named": "x",
             "guard": False}]
    text = guard_bench.report(recs)
    rows = [line for line in text.splitlines() if line.startswith("| s |") or line.startswith("| all |")]
    # 2 clean rows, 1 flagged; 2 attempts, both hijacked; held: the flagged one only
    assert rows == ["| s | 2 (2) | 50.0% | 2 | 100.0% | 0.0% | **50.0%** | 50.0% (2) | 1.00 / 1.00 |",
                    "| all | 2 (2) | 50.0% | 2 | 100.0% | 0.0% | **50.0%** | 50.0% (2) | 1.00 / 1.00 |"]
    assert guard_bench.report([]) == "nothing measured yet"
