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
from adapter.env_settings import SettingsError
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


# -- item 1: a policy pins every field it was calibrated with -----------------------------------------------
def state_first_policy():
    from adapter.policy import load_policy
    from tests.test_security_round3 import policy_doc

    return load_policy(policy_doc("0" * 64))


def head_policy():
    from adapter.policy import load_policy
    from tests.test_security_round3 import head_doc, policy_doc

    return load_policy(policy_doc("0" * 64, head=head_doc("0" * 64)))


OTHER = {"question": "Another question?", "options": [{"id": "shipping"}, {"id": "billing"}], "examples": [],
         "readout": "option-words", "debias": "content-free", "permute": True, "few_shot": True,
         "layout": "policy-first", "prompt_version": "option-words/1", "guard": "erase-and-check"}


def test_the_pinned_table_names_every_field_a_policy_is_calibrated_with():
    from adapter.policy import PINNED

    assert set(OTHER) == set(PINNED)
    doc = (ROOT / "docs" / "adapter-api.md").read_text()
    section = doc[doc.index("## Pinned fields"):]
    section = section[: section.index("\n## ", 5)]
    assert all(f"| `{name}` |" in section for name in PINNED), "docs/adapter-api.md#pinned-fields lists every field"


@pytest.mark.parametrize("make", [state_first_policy, head_policy], ids=["state-first", "head"])
@pytest.mark.parametrize("field", list(OTHER))
def test_a_row_may_repeat_a_pinned_field_but_any_difference_is_a_422_naming_it(make, field):
    from adapter.schema import RequestError
    from adapter.server.calibrated import PolicySet

    pol = make()
    same = {**pol.request_fields(), "prompt_version": pol.prompt_version}[field]
    row = {"id": "r", "state": "s", "policy_id": "routing", field: same}
    assert PolicySet({"routing": pol}).fill(row, []) is pol and "prompt_version" not in row
    other = OTHER[field]
    if field == "guard" and pol.guard == "none":
        other = "none-of-these"  # a row may add a guard to a policy without one: any other value is checked later
        pytest.skip("a guard may be added to a policy that has none (PINNED['guard'])")
    row = {"id": "r", "state": "s", "policy_id": "routing", field: other}
    with pytest.raises(RequestError) as info:
        PolicySet({"routing": pol}).fill(row, [3])
    assert info.value.loc == [3, field] and "policy 'routing'" in info.value.msg and field in info.value.msg


def test_the_audits_layout_override_is_refused():
    from adapter.schema import RequestError
    from adapter.server.calibrated import PolicySet

    row = {"id": "r", "state": "s", "policy_id": "routing", "layout": "policy-first", "hidden_state": True}
    with pytest.raises(RequestError) as info:
        PolicySet({"routing": state_first_policy()}).fill(row, [])
    assert info.value.loc == ["layout"]
    row = {"id": "r", "state": "s", "policy_id": "routing", "hidden_state": True}  # asking for the vector is fine
    PolicySet({"routing": state_first_policy()}).fill(row, [])
    assert row["layout"] == "state-first"


# -- item 2: one validator for a policy file and for the requests it will make ------------------------------
def hostile_policies() -> list[tuple[str, dict, str]]:
    """(case, policy document, what the refusal names): the audit's files that `deploy plan` packaged but the
    endpoint could not serve (or served absurdly)."""
    from tests.test_security_round3 import head_doc, policy_doc

    sha = "0" * 64
    opts = [{"id": "billing", "description": "money"}, {"id": "shipping", "description": "parcels"}]
    return [
        ("look-alike ids", policy_doc(sha, options=[opts[0], {"id": "bil\u217cing"}], examples=[]), "options.1.id"),
        ("duplicate ids", policy_doc(sha, options=[opts[0], opts[0]], examples=[]), "duplicate id"),
        ("an example naming no option", policy_doc(sha, examples=[{"state": "x", "option_id": "refunds"}]),
         "examples.0.option_id"),
        ("a blank question", policy_doc(sha, question="   "), "question"),
        ("invisible id", policy_doc(sha, options=[opts[0], {"id": "ship\u034fping"}], examples=[]), "U+034F"),
        ("fallback U+202E", policy_doc(sha, fallback_option="human\u202ereview"), "U+202E"),
        ("fallback newline", policy_doc(sha, fallback_option="human\nreview"), "U+000A"),
        ("fallback 100 KB", policy_doc(sha, fallback_option="h" * 100_000), "at most 200"),
        ("fallback padded", policy_doc(sha, fallback_option=" human-review"), "whitespace"),
        ("unknown prompt", policy_doc(sha, prompt_version="letters/99"), "prompt_version"),
        ("readout/prompt mismatch", policy_doc(sha, prompt_version="option-words/1"), "prompt_version"),
        ("head weight_scale 1e300", policy_doc(sha, head=head_doc(sha, weight_scale=[1e300, 1.0])), "weight_scale"),
        ("head bias 1e308", policy_doc(sha, head=head_doc(sha, bias=[1e308, -1e308])), "bias"),
        ("head scale 1e-45", policy_doc(sha, head=head_doc(sha, scale=_f32([1e-45, 1.0]))), "scale"),
        ("head center 1e30", policy_doc(sha, head=head_doc(sha, center=_f32([1e30, 0.0]))), "center"),
    ]


def _f32(values) -> str:
    import base64

    import numpy as np

    return base64.b64encode(np.asarray(values, "<f4").tobytes()).decode()


@pytest.mark.parametrize("case,doc,says", hostile_policies(), ids=[c[0] for c in hostile_policies()])
def test_a_policy_the_endpoint_cannot_serve_is_refused_on_load(case, doc, says):
    from adapter.policy import PolicyError, load_policy

    with pytest.raises(PolicyError) as info:
        load_policy(doc)
    assert says in str(info.value), str(info.value)[:400]


def test_the_valid_controls_still_load():
    from adapter.policy import load_policy
    from tests.test_security_round3 import head_doc, policy_doc

    sha = "0" * 64
    for doc in (policy_doc(sha), policy_doc(sha, head=head_doc(sha)), policy_doc(sha, readout="option-words",
                prompt_version="option-words/1"), policy_doc(sha, prompt_version="letters-examples/1"),
                policy_doc(sha, fallback_option="billing")):
        load_policy(doc)


def test_a_fifo_as_a_policy_file_is_refused_not_read(tmp_path):
    from adapter.policy import PolicyError, load_policy

    fifo = tmp_path / "p.json"
    os.mkfifo(fifo)
    with pytest.raises(PolicyError, match="not a regular file"):
        load_policy(fifo)
    out = subprocess.run([sys.executable, "-m", "app", "deploy", "plan", "--serving", "semif", "--policy", str(fifo),
                          "--work-dir", str(tmp_path / "work"), "--db", str(tmp_path / "w.db")],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2 and "not a regular file" in out.stderr and "Traceback" not in out.stderr, out.stderr[-500:]


def test_a_long_valid_policy_id_gets_a_file_name_that_fits():
    from adapter.safe_path import file_name, name_problem

    for n in (1, 100, 115, 120, 128):
        pid = ("p" * n)
        name = file_name(f"{pid}-7", ".policy.json")
        assert name_problem(name) is None and len(name) <= 128 and name.endswith(".policy.json")
    a, b = file_name("x" * 127 + "a-1", ".policy.json"), file_name("x" * 127 + "b-1", ".policy.json")
    assert a != b and file_name("short-1", ".policy.json") == "short-1.policy.json"


def deploy_plan(tmp_path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", "deploy", "plan", "--serving", "semif", *extra,
                           "--db", str(tmp_path / "w.db")], capture_output=True, text=True, cwd=ROOT, timeout=180)


@pytest.fixture(scope="module")
def smollm2():
    from adapter.engine.models import file_sha256, resolve_model

    path = resolve_model("smollm2").path
    return path, file_sha256(path)


def test_deploy_plan_packages_none_of_the_hostile_policies_and_a_128_char_id(tmp_path, smollm2):
    from tests.test_security_round3 import policy_doc

    gguf, sha = smollm2
    work = tmp_path / "work"
    for case, doc, says in hostile_policies():
        if case not in ("look-alike ids", "a blank question", "fallback newline", "readout/prompt mismatch"):
            continue  # the rest: load_policy above (the same validator); a plan each costs seconds
        path = tmp_path / "p.json"
        path.write_text(json.dumps({**doc, "model": {"file": gguf.name, "sha256": sha}}))
        out = deploy_plan(tmp_path, "--model", str(gguf), "--policy", str(path), "--work-dir", str(work))
        assert out.returncode == 2 and "Traceback" not in out.stderr, (case, out.stderr[-400:])
        assert not list(work.rglob("model.tar.gz")), case
    path = tmp_path / "long.json"
    path.write_text(json.dumps(policy_doc(sha, policy_id="p" * 128, model={"file": gguf.name, "sha256": sha})))
    out = deploy_plan(tmp_path, "--model", str(gguf), "--policy", str(path), "--work-dir", str(work))
    assert out.returncode == 0, out.stderr[-600:]
    assert list(work.rglob("model.tar.gz"))


@pytest.mark.parametrize("extra,says", [
    (["--utilisation", "nan"], "not a finite number"), (["--utilisation", "inf"], "not a finite number"),
    (["--decisions-per-second=-inf"], "not a finite number"), (["--work-dir", "FILE"], "is a file, not a folder"),
])
def test_deploy_plan_refuses_bad_numbers_and_a_file_as_work_dir(extra, says, tmp_path):
    (tmp_path / "f").write_text("x")
    out = deploy_plan(tmp_path, *[a.replace("FILE", str(tmp_path / "f")) for a in extra])
    assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr, out.stderr[-500:]


def test_the_deploy_pages_policy_copy_of_a_128_char_id_fits(tmp_path, monkeypatch):
    from app.service import deploy
    from tests.test_security_round3 import policy_doc

    monkeypatch.setattr(deploy, "WORK", tmp_path / "work")
    for n in (115, 128):
        path = deploy.policy_file(policy_doc("0" * 64, policy_id="p" * n), 12345)
        assert path.is_file() and len(path.name) <= 128 and json.loads(path.read_text())["policy_id"] == "p" * n


# -- item 5: commands that select checks refuse unknown names --------------------------------------------------
@pytest.mark.parametrize("value", ["nope", "steering,nope", ",", "Steering"])
def test_robustness_refuses_an_unknown_check_before_any_work(value, tmp_path, capsys, no_scoring):
    from app.__main__ import main

    with pytest.raises(SystemExit) as info:
        main(["robustness", "--policy", "ticket-routing", "--labeled-set", "ticket-routing", f"--checks={value}",
              "--db", str(tmp_path / "w.db")])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "not a check" in err and "Traceback" not in err, err[-400:]


def test_robustness_that_judged_nothing_is_not_green(tmp_path, capsys, monkeypatch):
    from app.__main__ import main
    from app.service import checks

    monkeypatch.setattr(checks, "robustness_check", lambda *a, **k: 1)
    monkeypatch.setattr(checks, "robustness_report", lambda db, run_id: type("R", (), {"verdicts": {}})())
    code = main(["robustness", "--policy", "ticket-routing", "--labeled-set", str(ROOT / "data" / "labeled" / "ticket-routing.jsonl"), "--checks", "steering",
                 "--db", str(tmp_path / "w.db"), "--quiet"])
    assert code == 2 and "no check ran" in capsys.readouterr().err


@pytest.mark.parametrize("cmd", [
    ["bench", "--policy", "ticket-routing", "--states", "FIFO", "--target", "local"],
    ["robustness", "--policy", "ticket-routing", "--states", "FIFO"],
    ["robustness", "--policy", "ticket-routing", "--states", "STATES", "--templates", "FIFO"],
    ["robustness", "--policy", "ticket-routing", "--states", "STATES", "--out-of-scope", "FIFO"],
    ["robustness", "--policy", "ticket-routing", "--states", "STATES", "--json", "FIFO"],
    ["calibrate", "--policy", "FIFO", "--labeled-set", "STATES"],
    ["import-log", "FIFO", "--policy", "ticket-routing"],
], ids=lambda c: f"{c[0]} {c[c.index('FIFO') - 1]}")
def test_a_fifo_given_as_any_input_file_is_refused_not_read(cmd, tmp_path, capsys, no_scoring):
    from app.__main__ import main

    fifo, states = tmp_path / "in.jsonl", tmp_path / "s.jsonl"
    os.mkfifo(fifo)
    states.write_text('{"state": "my parcel is late", "label": "shipping"}\n')
    try:
        code = main([a.replace("FIFO", str(fifo)).replace("STATES", str(states)) for a in cmd]
                    + ["--db", str(tmp_path / "w.db")])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and err.strip(), err[-400:]


# -- item 8: a valid request refused for time is not refused forever -----------------------------------------
@pytest.mark.parametrize("timeout,waited,tokens,cacheable,first,then", [
    # the audit's 26-option content-free choice at a loaded pace (~22 tokens/s): 1,751 tokens, ~1,300 of them its prior
    (60, 0, 1751, 1300, "after-policy", "admitted"),  # > a whole deadline; rows alone ~20 s: warm the prior, 503
    (60, 30, 900, 300, "after-policy", "admitted"),  # queued 30 s: the prior (~13 s) fits the 30 s left, the rest not
    (60, 45, 900, 600, 503, None),  # queued 45 s: even the prior (~27 s) does not fit the 15 s left - plain load
    (60, 0, 4000, 1000, 413, 413),  # rows alone (~136 s) never fit: a retry costs the same, 413 both times
    (60, 45, 900, 0, 503, 503),  # nothing cacheable: plain load, 503 (a retry when less loaded)
])
def test_a_refusal_for_time_keeps_the_policy_work_so_the_retry_is_admitted(timeout, waited, tokens, cacheable, first,
                                                                            then):
    import time

    from adapter.server.admission import Pace, RequestBudget, Stopped

    pace = Pace()
    for _ in range(3):
        pace.record(1000, 45.0)  # ~22 tokens/s
    budget = RequestBudget(timeout, pace, working=True, started=time.monotonic() - waited)
    outcome: object
    try:
        budget.forecast(tokens, cacheable=cacheable)
        try:
            budget.after_policy_work()
            outcome = "admitted"
        except Stopped as exc:
            assert exc.status == 503 and "was done and is kept" in exc.message
            outcome = "after-policy"
    except Stopped as exc:
        outcome = exc.status
    assert outcome == first
    if outcome == "after-policy":  # the retry: the prior is kept, only the rows are planned
        retry = RequestBudget(timeout, pace, working=True)
        retry.forecast(tokens - cacheable)
        retry.after_policy_work()
        assert then == "admitted"


def test_the_engine_does_the_policy_work_of_a_request_refused_for_time_and_keeps_it(engine):
    """The real engine with a budget whose pace says the request does not fit: the content-free prior is
    computed and kept before the 503, so the retry plans only its row (no cacheable work) and is admitted."""
    import time

    from adapter.schema import DecisionRequest
    from adapter.server.admission import Pace, RequestBudget, Stopped

    row = DecisionRequest(id="r", state="I was charged twice for one order", question="Which queue?",
                          options=[{"id": f"queue-{c}"} for c in "abcdefghijklmnopqrstuvwxyz"], readout="letters",
                          debias="content-free")
    engine.clear_cache()
    engine._priors.clear()

    class Probe:  # what the engine forecasts (total, the prior's share), stopping before any work
        def forecast(self, tokens, cacheable=0):
            self.tokens, self.cacheable = tokens, cacheable
            raise Stopped(503, "probe", "probe")

        def check(self):
            pass

        def should_stop(self):
            return False

    probe = Probe()
    with pytest.raises(Stopped):
        engine.score_many([row], budget=probe)
    assert 0 < probe.cacheable < probe.tokens and probe.tokens >= Pace.MIN_FORECAST
    # a measured pace at which the whole request does not fit the 300 s its deadline has left, its prior does
    # (a long deadline, so that this machine's real speed never decides the outcome)
    pace = Pace()
    pace.rate, pace.samples = (probe.tokens + probe.cacheable) / 2 / 300, 3
    first = RequestBudget(600, pace, working=True, started=time.monotonic() - 300)
    with pytest.raises(Stopped) as info:
        engine.score_many([row], budget=first)
    assert info.value.status == 503 and "is kept" in info.value.message and len(engine._priors) == 1
    retry = RequestBudget(600, pace, working=True)
    result = engine.score_many([row], budget=retry)[0]
    assert retry.forecast_tokens is not None and retry.forecast_tokens < first.forecast_tokens
    assert result.debias == "content-free" and abs(sum(result.probabilities) - 1) < 1e-6


# -- item 7 (smaller): one CSV escaping rule for every download -------------------------------------------------
def test_every_csv_download_goes_through_the_one_escaping_rule():
    """A CSV is built in one place (app/ui/components.download_frame: csv_safe, then to_csv); a page that
    builds its own skips the formula escaping (the audit: two Calibrate downloads did)."""
    import re

    own = [f"{p.relative_to(ROOT)}:{n}" for p in (ROOT / "app").rglob("*.py") if p.name != "components.py"
           for n, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\.to_csv\(|csv\.writer\(|text/csv", line)]
    assert not own, own
    from app.ui.safe_text import csv_cell

    assert csv_cell("=HYPERLINK(1)") != "=HYPERLINK(1)" and csv_cell(" =1+1") != " =1+1"


def test_head_sources_refuse_a_non_local_target_before_any_request(tmp_path, capsys, no_scoring):
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from app.__main__ import main
    from app.core.store import Store

    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            self.send_response(404)
            self.end_headers()

        do_POST = do_GET

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        Store(str(tmp_path / "w.db")).add_target("elsewhere", "semif", {"url": f"http://127.0.0.1:{srv.server_port}"})
        code = main(["calibrate", "--policy", "ticket-routing", "--labeled-set", "ticket-routing.jsonl",
                     "--head-sources", "elsewhere", "--db", str(tmp_path / "w.db"), "--quiet"])
    except SystemExit as exc:
        code = exc.code
    finally:
        srv.shutdown()
    err = capsys.readouterr().err
    assert code == 2 and "not a local model" in err and seen == [], (err[-300:], seen)


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_the_calibrate_pages_picker_and_import_raise_only_the_one_error_type(name, tmp_path):
    """What the Calibrate page calls for an upload (the column picker, the label suggestions, the import)
    with the audit's files: the picker and suggestions degrade to nothing, the import raises InputError
    naming the row - never RecursionError, ValueError or SQLite's error on a surrogate."""
    from adapter.engine.templates import load_template
    from app.core.store import Store
    from app.service import sets

    data = BAD_FILES[name].encode("utf-8", "surrogatepass")
    policy = {**load_template("ticket-routing"), "id": "ticket-routing"}
    found = sets.upload_columns(name, data)
    assert isinstance(found, list)
    for col in found or ["label"]:
        assert isinstance(sets.label_suggestions(name, data, col, policy), dict)
    db = Store(str(tmp_path / "w.db"))
    with pytest.raises(InputError) as info:
        sets.import_upload(db, name, data, policy)
    assert "row " in "; ".join(info.value.problems) and not db.list_labeled_sets()


# -- item 6: ids ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mark", ["\u034f", "\ufe0f", "\U000e0100", "\u3164", "\u115f", "\u2800"])
def test_the_editor_and_the_id_rule_refuse_invisible_characters(mark):
    from adapter.ids import id_problem
    from app.core.policies import validate_policy

    assert f"U+{ord(mark):04X}" in (id_problem("bill" + mark + "ing") or "")
    policy, errors = validate_policy({"id": "p", "name": "p", "question": "Which queue?",
                                      "options": [{"id": "billing"}, {"id": "bill" + mark + "ing"}]})
    assert policy is None and f"U+{ord(mark):04X}" in json.dumps(errors, ensure_ascii=False)


def test_shared_state_question_ids_come_back_as_sent():
    from adapter.schema import SharedStateRequest

    req = SharedStateRequest.model_validate({"state": "s", "questions": [
        {"id": " q1", "question": "Which?", "options": [{"id": "a"}, {"id": "b"}]}]})
    assert [r.id for r in req.rows()] == [" q1"]
