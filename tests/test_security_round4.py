"""Issue 41 (security and reliability round 4): a table test per finding of the audit - bodies, files,
arguments - each failing before its fix. The steering guard (item 7) has its own tests."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

from adapter.server.decision_log import DecisionLog, DecisionLogSettings
from adapter.server.settings import SettingsError
from app.core.inputs import MAX_ROWS, InputError, read_records
from tests.conftest import ROOT

DEEP = "[" * 100_000 + "]" * 100_000


# -- item 4: one reader for labeled sets, states and decision logs ---------------------------------------
@pytest.mark.parametrize("name,data,says", [
    ("deep.jsonl", ('{"state": "ok", "label": "a"}\n{"state": ' + DEEP + ', "label": "a"}\n').encode(),
     "row 2: nested"),
    ("int.jsonl", ('{"state": "ok", "label": "a"}\n{"state": ' + "9" * 5000 + ', "label": "a"}\n').encode(),
     "row 2: an integer has more than 4,300 digits"),
    ("sur.jsonl", b'{"state": "ok", "label": "a"}\n{"state": "x\\ud800y", "label": "a"}\n', "row 2: field state holds a lone"),
    ("surkey.jsonl", b'{"state": "ok", "label": "a", "\\udfff": 1}\n', "row 1: field"),
    ("nul.jsonl", b'{"state": "ok\\u0000", "label": "a"}\n', "row 1: field state holds a NUL"),
    ("nul.csv", b'state,label\nfine,a\nbad\x00,a\n', "row 3, column state: holds a NUL"),
    ("nan.jsonl", b'{"state": "ok", "label": "a", "w": NaN}\n', "row 1: NaN is not a JSON number"),
    ("twice.jsonl", b'{"state": "ok", "label": "a", "state": "other"}\n', "row 1: key 'state' appears twice"),
    ("twice.csv", b'state,label,state\none,a,two\n', "row 1 (header): column 'state' appears twice"),
    ("notutf8.csv", b'state,label\n\xff\xfe,a\n', "not UTF-8"),
])
def test_the_reader_refuses_a_bad_row_naming_its_row_and_field(name, data, says):
    problems: list[str] = []
    with pytest.raises(InputError) as info:
        recs = read_records(name, data, problems, required="label")
        if problems:
            raise InputError(problems)
        assert not recs
    assert says in "; ".join(info.value.problems), info.value.problems


def test_the_reader_caps_rows_with_a_clear_message(monkeypatch):
    import app.core.inputs as inputs

    monkeypatch.setattr(inputs, "MAX_ROWS", 50)
    monkeypatch.setattr(inputs.iter_records, "__defaults__", (None, "state", 50))
    data = "state,label\n" + "".join(f"s{i},a\n" for i in range(60))
    with pytest.raises(InputError) as info:
        read_records("big.csv", data.encode(), [], required="label")
    assert "more than 50 rows" in info.value.problems[0]
    assert MAX_ROWS == 100_000


def test_the_reader_streams_rows_lazily():
    from app.core.inputs import iter_records

    data = ("state\n" + "x\n" * 10).encode()
    rows = iter_records("s.csv", data, [])
    assert next(rows) == (2, {"state": "x"})  # a generator: nothing beyond the first row was read yet


def decision_line(**over) -> str:
    rec = {"semif_decision": 1, "time": "2026-12-05T10:00:00.000+00:00", "request_id": "q1", "row_id": "r1",
           "option_ids": ["billing", "shipping"], "probabilities": [0.7, 0.3], **over}
    return json.dumps({k: v for k, v in rec.items() if v is not ...})


@pytest.mark.parametrize("line,says", [
    (decision_line(time=...), "without time"),
    ('{"semif_decision": 1, "x": ' + DEEP + "}", "nested"),
    (decision_line(probabilities="x"), "probabilities is not 2 finite numbers"),
    (decision_line().replace("0.7", "NaN"), "NaN is not a JSON number"),
    (decision_line(probabilities=[1.5, -0.5]), "probabilities is not 2 finite numbers"),
    (decision_line(probabilities=[0.5, 0.1]), "sum to 0.6000"),
    (decision_line(time="yesterday"), "time 'yesterday' is not an ISO 8601 time"),
    (decision_line(time="2026-12-05T10:00:00"), "with a zone"),
    (decision_line(option_ids=["billing", "bill\u034fing"]), "option_ids.1"),
    (decision_line(option_ids=["a", 3]), "option_ids is not a list"),
    (decision_line(row_id="r\n1"), "row_id is not a printable string"),
    (decision_line(row_id="r\ud800"), "lone UTF-16 surrogate"),
])
def test_import_log_leaves_out_an_invalid_decision_line_naming_its_line(line, says):
    from app.core.decision_import import parse_text

    parsed = parse_text(("uvicorn: started\n" + decision_line() + "\n" + line + "\n").encode("utf-8", "surrogatepass"))
    assert len(parsed.records) == 1 and parsed.skipped == 1
    assert len(parsed.problems) == 1 and parsed.problems[0].startswith("line 3: ") and says in parsed.problems[0], \
        parsed.problems


def test_import_log_of_only_bad_lines_is_exit_2_without_a_traceback(tmp_path):
    log = tmp_path / "d.jsonl"
    log.write_text(decision_line(time=...) + "\n" + '{"semif_decision": 1, "x": ' + DEEP + "}\n")
    out = subprocess.run([sys.executable, "-m", "app", "import-log", str(log), "--policy", "ticket-routing",
                          "--db", str(tmp_path / "w.db")], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr and "line 1" in out.stderr, out.stderr[-600:]


# the audit's files, given to every command that reads a labeled set or a states file
BAD_FILES = {
    "deep.jsonl": '{"state": "ok", "label": "billing"}\n{"state": ' + DEEP + ', "label": "billing"}\n',
    "surrogate.jsonl": '{"state": "ok", "label": "billing"}\n{"state": "x\\ud800", "label": "billing"}\n',
    "bigint.jsonl": '{"state": ' + "7" * 5000 + ', "label": "billing"}\n',
    "twice.csv": "state,label,state\na,billing,b\n",
}
COMMANDS = [
    ["calibrate", "--policy", "ticket-routing", "--labeled-set", "FILE"],
    ["check", "--policy", "ticket-routing", "--labeled-set", "FILE", "--min-accuracy", "0.5"],
    ["robustness", "--policy", "ticket-routing", "--labeled-set", "FILE"],
    ["bench", "--policy", "ticket-routing", "--states", "FILE", "--target", "local"],
]


@pytest.fixture
def no_scoring(monkeypatch):
    from app.service import evaluate

    monkeypatch.setattr(evaluate, "evaluate_one", lambda *a, **k: pytest.fail("scored a file that should be refused"))


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("name", list(BAD_FILES))
def test_every_command_refuses_a_bad_file_with_one_line_and_its_row(cmd, name, tmp_path, capsys, no_scoring):
    from app.__main__ import main

    path = tmp_path / name
    path.write_text(BAD_FILES[name], encoding="utf-8", errors="surrogatepass")
    try:
        code = main([a.replace("FILE", str(path)) for a in cmd] + ["--db", str(tmp_path / "w.db")])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "row " in err, err[-800:]


@pytest.mark.parametrize("text,says", [
    ("[" * 100_000 + "]" * 100_000, "nested"), ('{"id": ' + "9" * 5000 + "}", "4,300 digits"),
    ('{"id": "a",\n "id": "b"}', "appears twice"), ('{"id": "\\ud800"}', "surrogate"), ('{"id": NaN}', "NaN"),
])
def test_the_policies_json_tab_reads_with_the_same_reader(text, says):
    from app.core.policies import parse_policy_json

    policy, errors = parse_policy_json(text)
    assert policy is None and says in errors["json"]


# -- item 3: the decision log never forgets a torn line ----------------------------------------------------
@pytest.mark.parametrize("budgets", [
    [70, 0, 0, None],  # a torn line, then two writes while the disk stays full (the newline fails too), then space
    [70, 0, None],
    [35, 3, 0, None],  # the repair newline fits, the line after it does not
    [0, 0, None],
])
def test_lines_lost_on_a_full_disk_equal_the_lines_missing(tmp_path, monkeypatch, budgets):
    import adapter.server.decision_log as dl

    path = tmp_path / "decisions.jsonl"
    dlog = DecisionLog(DecisionLogSettings.from_env({"SM_SEMIF_DECISION_LOG": str(path)}))
    real = os.write
    left = {"bytes": None}

    def full_disk(fd, data):  # an injected ENOSPC once the batch's byte budget is spent
        if left["bytes"] is None:
            return real(fd, data)
        if left["bytes"] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = real(fd, bytes(data[: left["bytes"]]))
        left["bytes"] -= n
        return n

    monkeypatch.setattr(dl.os, "write", full_disk)
    sent = 0
    for batch, budget in enumerate(budgets):
        left["bytes"] = budget
        lines = [json.dumps({"batch": batch, "n": i, "pad": "x" * 20}) for i in range(2)]
        dlog.write(lines)
        sent += len(lines)
    dlog.close()
    whole = []
    for line in path.read_text().splitlines():
        try:
            whole.append(json.loads(line))
        except ValueError:
            pass
    assert dlog.lost == sent - len(whole) and whole[-2:] == [{"batch": len(budgets) - 1, "n": i, "pad": "x" * 20}
                                                          for i in range(2)]


def test_a_fifo_or_device_as_the_decision_log_is_the_exit_2_line(tmp_path):
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    with pytest.raises(SettingsError, match="not a regular file"):
        DecisionLogSettings.from_env({"SM_SEMIF_DECISION_LOG": str(fifo)})
    with pytest.raises(SettingsError, match="not a regular file"):
        DecisionLogSettings.from_env({"SM_SEMIF_DECISION_LOG": "/dev/null"})
    out = subprocess.run([sys.executable, "-m", "adapter", "serve", "--port", "0"], capture_output=True, text=True,
                         cwd=ROOT, timeout=60, env={**os.environ, "SM_SEMIF_DECISION_LOG": str(fifo)})
    assert out.returncode == 2 and "SM_SEMIF_DECISION_LOG" in out.stderr and "not a regular file" in out.stderr
    assert "Traceback" not in out.stderr
