"""Issue 42 item 3, "one call per command": `run` in app/cli/robustness.py and in app/cli/bench.py assemble
their inputs (policy, labeled set or states, calibrated policies, targets) with at most one store call per
input. The store is real SQLite; every public method of Store (whatever table module it comes from) is
counted at its outermost call, and the command is stopped where its action would start scoring
(checks.robustness_check, decide.bench), so nothing is scored and no model is loaded."""
from __future__ import annotations

import functools
import inspect
import threading
from pathlib import Path
from typing import Any, Callable

import pytest

from adapter.engine.templates import load_template
from app.__main__ import main
from app.core.store import Store
from app.service import checks, decide

ROOT = Path(__file__).resolve().parent.parent
REFUND = load_template("refund-check")
SHA = "a" * 64


class Assembled(Exception):
    """Raised where the command's action starts: its inputs are assembled."""


def calibrated_config(run_id: int) -> dict[str, Any]:
    return {"policy_id": "refund-check", "policy_version": 1, "question": REFUND["question"],
            "options": REFUND["options"], "readout": "letters", "prompt_version": "letters/1",
            "model": {"file": "m.gguf", "sha256": SHA}, "temperature": 1.0, "threshold": 0.7,
            "fallback_option": "human-review", "created_at": "2026-12-03T10:00:00", "guard": "none",
            "run_id": run_id}


def counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Wrap every public Store method (its own or a table module's): the names of the outermost calls made."""
    calls: list[str] = []
    depth = threading.local()

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def counted(*args: Any, **kwargs: Any) -> Any:
            level = getattr(depth, "n", 0)
            if level == 0:
                calls.append(name)
            depth.n = level + 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth.n = level
        return counted

    for name, fn in inspect.getmembers(Store, inspect.isfunction):
        if not name.startswith("_") and name not in ("db", "write"):  # the connection itself is no call
            monkeypatch.setattr(Store, name, wrap(name, fn))
    assert len(calls) == 0 and sum(1 for n, _ in inspect.getmembers(Store, inspect.isfunction)
                                   if not n.startswith("_")) >= 40  # every table's methods are counted
    return calls


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A store with a finished evaluation run of refund-check and a calibrated policy fitted on it (saved #1),
    so the calibrated input's fitted rows are really read back."""
    path = tmp_path / "wb.db"
    store = Store(path)
    run_id = store.create_run(kind="evaluation", policy=REFUND, target={"name": "local"}, n_rows=1)
    store.add_result(run_id, {"row_key": "r0", "position": 0, "state": "my parcel never came", "label": "yes",
                              "option_ids": ["yes", "no"], "probabilities": [0.9, 0.1], "top_option": "yes"})
    store.finish_run(run_id)
    assert store.save_calibrated(calibrated_config(run_id)) == 1
    return path


def assemble(monkeypatch: pytest.MonkeyPatch, argv: list[str], action: tuple[Any, str]) -> tuple[list[str], Any]:
    """Run the command until its action: the store calls made on the way, and what the action was given."""
    calls = counting(monkeypatch)
    given: list[Any] = []

    def stop(*args: Any, **kwargs: Any) -> Any:
        given.append((args, kwargs))
        raise Assembled

    monkeypatch.setattr(*action, stop)
    with pytest.raises(Assembled):
        main(argv)
    return calls, given[0]


def test_robustness_assembles_its_inputs_with_one_store_call_per_input(monkeypatch, db):
    # inputs: the policy (a template, saved on first use), the labeled set (a file, imported), a saved calibrated
    # policy (with the rows its head was fitted on), the target
    calls, (args, _) = assemble(monkeypatch, [
        "robustness", "--policy", "refund-check", "--labeled-set", str(ROOT / "data/labeled/refund-check.jsonl"),
        "--calibrated", "1", "--target", "local", "--limit", "4", "--db", str(db)],
        (checks, "robustness_check"))
    print("robustness store calls:", len(calls), calls)
    assert len(calls) <= 4, calls
    spec = args[1]
    assert len(spec.cases) == 4 and spec.calibrated is not None and spec.calibrated.fitted  # the inputs really came


def test_bench_assembles_its_inputs_with_one_store_call_per_input(monkeypatch, db, tmp_path):
    # inputs: the policy, the states (a file: no store call), two saved calibrated policies, two targets
    states = tmp_path / "states.jsonl"
    states.write_text('{"state": "my parcel never came", "label": "yes"}\n{"state": "wrong size", "label": "no"}\n')
    calls, (args, _) = assemble(monkeypatch, [
        "bench", "--policy", "refund-check", "--states", str(states), "--calibrated", "1", "--calibrated", "#1",
        "--target", "local", "--target", "local", "--db", str(db)], (decide, "bench"))
    print("bench store calls:", len(calls), calls)
    assert len(calls) <= 4, calls
    given = args[1]  # decide.bench(store, inputs): the resolved Inputs
    assert len(given.cases) == 2 and len(given.targets) == 2 and len(given.calibrated) == 2
    assert all(p.fitted for p in given.calibrated)


# -- the importer's mapping flags on bench and robustness (issue 43 item 2's remainder), through the resolver --
TRIAGE = ("issue_id,issue_text,team\n"
          "GH-1042,The export button crashes the app when the file name has a space in it,bug\n"
          "GH-1043,Could you add a dark mode to the settings page please,FR\n"
          "GH-1044,How do I change the language of the interface to German?,question\n"
          "GH-1045,Saving a draft loses the attachments every single time,bug\n").encode()
TRIAGE_POLICY = {"id": "triage", "name": "GitHub issue triage", "question": "What kind of GitHub issue is this?",
                 "options": [{"id": o, "description": o.replace("_", " ")} for o in ("bug", "feature_request", "question")]}


@pytest.fixture
def triage(tmp_path: Path) -> dict[str, str]:
    import json

    (tmp_path / "p.json").write_text(json.dumps(TRIAGE_POLICY))
    (tmp_path / "issues.csv").write_bytes(TRIAGE)
    return {"policy": str(tmp_path / "p.json"), "file": str(tmp_path / "issues.csv"), "db": str(tmp_path / "t.db")}


def test_bench_reads_states_through_the_mapping_flags(monkeypatch, triage, capsys):
    _, (args, _) = assemble(monkeypatch, [
        "bench", "--policy", triage["policy"], "--states", triage["file"], "--state-column", "issue_text",
        "--id-column", "issue_id", "--label-column", "team", "--map-label", "FR=feature_request",
        "--target", "local", "--db", triage["db"]], (decide, "bench"))
    given = args[1]
    assert [(c.key, c.label) for c in given.cases] == [("GH-1042", "bug"), ("GH-1043", "feature_request"),
                                                       ("GH-1044", "question"), ("GH-1045", "bug")]
    assert given.cases[0].state.startswith("The export button")
    assert "'FR' -> feature_request" in capsys.readouterr().err  # the mapping as read, printed


def test_robustness_imports_a_labeled_set_through_the_mapping_flags(monkeypatch, triage):
    _, (args, _) = assemble(monkeypatch, [
        "robustness", "--policy", triage["policy"], "--labeled-set", triage["file"], "--state-column", "issue_text",
        "--map-label", "FR=feature_request", "--target", "local", "--db", triage["db"]], (checks, "robustness_check"))
    spec = args[1]
    assert [c.key for c in spec.cases] == ["GH-1042", "GH-1043", "GH-1044", "GH-1045"]  # the id column proposed
    assert spec.cases[1].label == "feature_request" and spec.source == f"labeled set {triage['file']}"
    assert Store(triage["db"]).list_labeled_sets()[0]["n_rows"] == 4


@pytest.mark.parametrize("command, extra, named", [
    ("bench", [], "--state-column issue_text"),  # no `state` column, no flag: the flags proposed
    ("robustness", [], "--state-column issue_text"),
    ("bench", ["--state-column", "body"], "--state-column 'body': "),
    ("robustness", ["--label-column", "kind"], "--label-column 'kind': "),
    ("bench", ["--state-column", "issue_text", "--map-label", "FR=feature"], "--map-label FR=feature: 'feature' is not"),
    ("bench", ["--state-column", "issue_text", "--map-label", "FR=feature_request", "--target", "nowhere"],
     "--target 'nowhere': no such target"),
    ("robustness", ["--state-column", "issue_text", "--target", "nowhere"], "--target 'nowhere': no such target"),
    ("robustness", ["--state-column", "issue_text", "--calibrated", "3"], "--calibrated no saved calibrated policy #3"),
])
def test_a_bad_mapping_or_input_exits_2_naming_the_flag_before_anything_runs(monkeypatch, triage, capsys,
                                                                             command, extra, named):
    monkeypatch.setattr(decide, "bench", lambda *a, **k: pytest.fail("scored"))
    monkeypatch.setattr(checks, "robustness_check", lambda *a, **k: pytest.fail("scored"))
    source = "--states" if command == "bench" else "--labeled-set"
    targets = [] if "--target" in extra else ["--target", "local"]
    code = main([command, "--policy", triage["policy"], source, triage["file"], *extra, *targets, "--db", triage["db"]])
    err = capsys.readouterr().err
    assert code == 2 and named in err, err
    assert not Store(triage["db"]).list_labeled_sets()  # nothing imported


def test_mapping_flags_need_a_file_and_a_pair(monkeypatch, triage, db, capsys):
    code = main(["robustness", "--policy", "refund-check", "--labeled-set", "1", "--state-column", "text",
                 "--db", str(db)])
    assert code == 2 and "--labeled-set '1' is no file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--policy", "refund-check", "--states", triage["file"], "--map-label", "FR", "--target", "local"])
    assert exit_.value.code == 2 and "give VALUE=OPTION" in capsys.readouterr().err


# -- the one-trip store reads behind the resolver keep the old answers ----------------------------------------
def test_a_policy_reference_resolves_as_before_in_one_trip(db, tmp_path):
    import json

    from app.service.policies import PolicyNotFound, resolve_policy

    store = Store(db)
    first = resolve_policy(store, "refund-check")  # a template, saved on first use, with its saved version
    assert first["version"] == 1 and store.get_policy("refund-check")["question"] == REFUND["question"]
    changed = {**REFUND, "question": "Refund it, really?"}
    (tmp_path / "p.json").write_text(json.dumps(changed))
    from_file = resolve_policy(store, str(tmp_path / "p.json"))  # same id saved with other content: the file's own
    assert from_file["question"] == "Refund it, really?" and "version" not in from_file
    assert store.get_policy("refund-check")["question"] == REFUND["question"]  # the saved one is not overwritten
    assert resolve_policy(store, "refund-check")["question"] == REFUND["question"]  # a saved id wins over a template
    with pytest.raises(PolicyNotFound, match="not a saved policy, a template"):
        resolve_policy(store, "no-such-policy")
    (tmp_path / "bad.json").write_text('{"id": "x"}')
    with pytest.raises(PolicyNotFound, match="is invalid"):
        resolve_policy(store, str(tmp_path / "bad.json"))


def test_calibrated_references_read_once_give_what_one_by_one_gave(db, tmp_path):
    import json

    from app.core import deployed
    from app.service import heads

    store = Store(db)
    (tmp_path / "cal.json").write_text(json.dumps(store.list_calibrated()[0]["config"]))
    saved, from_file = heads.as_deployed_all(store, ["#1", str(tmp_path / "cal.json")])
    assert saved.id == 1 and from_file.id is None and from_file.source == "cal.json"
    one_by_one = deployed.fitted_states(store, store.list_calibrated()[0]["config"])
    assert saved.fitted == from_file.fitted == one_by_one and len(one_by_one) == 1
    with pytest.raises(ValueError, match=r"no saved calibrated policy #7; saved: #1"):
        heads.as_deployed_all(store, ["1", "7"])


def test_the_commands_resolve_their_inputs_only_through_the_one_service_call():
    """No command assembles an input by itself any more: calibrate, bench, robustness and import-log call
    common.resolve (app/service/inputs.resolve) and check calls ci_check.resolve - never the per-input helpers."""
    import ast

    per_input = {"resolve_policy", "resolve_set", "as_deployed", "as_deployed_all", "target", "by_name",
                 "states_from_upload", "set_states", "cli_mapping", "local_names"}
    for name in ("bench", "robustness", "calibrate", "import_log", "check"):
        tree = ast.parse((ROOT / "app" / "cli" / f"{name}.py").read_text())
        called = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
                  for n in ast.walk(tree) if isinstance(n, ast.Call)}
        assert not called & per_input, f"app/cli/{name}.py assembles {sorted(called & per_input)} itself"
        assert "resolve" in called, f"app/cli/{name}.py does not resolve its inputs in one call"
