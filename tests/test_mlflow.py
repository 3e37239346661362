"""MLflow tracking and the policy registry (issue 46), with the real MLflow client on a temporary sqlite
tracker (never a mock) and a real calibration of SmolLM2 on a small labeled set (scored once per module;
the second calibration copies the stored results).

- a calibration on the command line, and the Save the Calibrate page calls, each appear as an MLflow run
  with the params, metrics, dataset hash and policy artifact - read back with MlflowClient;
- register -> promote -> `deploy plan --policy models:/...@production` -> rollback -> the plan packages the
  previous version (the policy inside model.tar.gz), end to end through the command line;
- the shadow check's drift report and its tolerance; an unreachable tracker is one warning and a queue that
  sends later; with the setting off nothing imports mlflow; bad input gets a message and nothing half-made.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import socket
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT

ENV_KEYS = ("SEMIF_DB", "SEMIF_MLFLOW_TRACKING_URI")


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def run_app(env: dict[str, str], *args: str) -> Ran:
    """`python -m app ARGS` in this process (app.__main__.main: the command line's own path, without a
    new interpreter's ~10 s of imports on a loaded machine), with `env`'s variables and working folder."""
    from app.__main__ import main

    saved, cwd = dict(os.environ), os.getcwd()
    out, err = io.StringIO(), io.StringIO()
    os.environ.clear()
    os.environ.update({k: v for k, v in env.items() if k != "CWD"})
    os.chdir(env["CWD"])
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 2
    finally:
        os.environ.clear()
        os.environ.update(saved)
        os.chdir(cwd)
    return Ran(int(code), out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """One tracker and one workbench DB for the module (MLflow's first sqlite database costs seconds), a
    12-row labeled set calibrated twice on the command line (the second copies the stored results)."""
    tmp = tmp_path_factory.mktemp("mlflow")
    rows = [json.loads(line) for line in (ROOT / "data/labeled/refund-check.jsonl").read_text().splitlines()]
    small = [r for r in rows if r["label"] == "yes"][:6] + [r for r in rows if r["label"] == "no"][:6]
    (tmp / "refund-small.jsonl").write_text("".join(json.dumps(r) + "\n" for r in small))
    (tmp / "cwd").mkdir()
    env = {**os.environ, "SEMIF_DB": str(tmp / "wb.db"), "SEMIF_MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'mlflow.db'}",
           "SM_SEMIF_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "CWD": str(tmp / "cwd"),
           "PYTHONPATH": str(ROOT)}
    outs = []
    for gate in (None, "0.5"):  # the first a real command line; the second in process (it copies stored results)
        out = tmp / f"policy-{gate or 'recommended'}.json"
        args = ("calibrate", "--policy", "refund-check", "--labeled-set", str(tmp / "refund-small.jsonl"), "--head",
                "none", "--quiet", "--out", str(out), *(["--gate", gate, "--learning-curve"] if gate else []))
        got = run_app(env, *args) if gate else subprocess.run(
            [sys.executable, "-m", "app", *args], cwd=env["CWD"], env=env, capture_output=True, text=True, timeout=900)
        assert got.returncode == 0, got.stderr[-3000:]
        assert "MLflow: sqlite:///" in got.stderr, got.stderr[-2000:]
        outs.append(out)
    return {"tmp": tmp, "env": env, "uri": env["SEMIF_MLFLOW_TRACKING_URI"], "policies": outs}


@pytest.fixture
def settings_env(world, monkeypatch):
    for k in ENV_KEYS:
        monkeypatch.setenv(k, world["env"][k])
    from app.core.store import Store

    return Store(world["env"]["SEMIF_DB"])


def client(world):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=world["uri"], registry_uri=world["uri"])


def runs_of(world, kind):
    c = client(world)
    exp = c.get_experiment_by_name("semif/refund-check")
    return [r for r in c.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"])
            if r.data.tags.get("semif.kind") == kind]


def test_a_command_line_calibration_is_an_mlflow_run_read_back_with_the_client(world):
    from app.core.store import Store

    calibrations = runs_of(world, "calibration")
    assert len(calibrations) == 2  # one per `calibrate` command (the evaluation runs are logged beside them)
    assert len(runs_of(world, "evaluation")) == 2
    run = calibrations[-1]  # the first command's: the recommended gate
    policy = json.loads(world["policies"][0].read_text())
    p, m, tags = run.data.params, run.data.metrics, run.data.tags
    assert p["model_sha256"] == policy["model"]["sha256"] and p["target"] == "local"
    assert p["readout"] == policy["readout"] and p["layout"] == policy["layout"] == "state-first"
    assert p["prompt_version"] == policy["prompt_version"] and p["head_kind"] == "none"
    assert p["correction"].startswith(policy["debias"]) and "else human-review" in p["gate_rule"]
    for key in ("accuracy", "macro_f1", "ece", "brier", "nll", "gate.coverage", "seconds_a_row", "tokens_a_row",
                "interval.accuracy.low", "interval.accuracy.high", "interval.macro_f1.low", "interval.ece.high"):
        assert key in m, key
    assert m["accuracy"] == pytest.approx(policy["metrics"]["accuracy"])
    assert m["interval.accuracy.low"] <= m["accuracy"] <= m["interval.accuracy.high"]
    assert m["gate.coverage"] == pytest.approx(policy["metrics"]["at_gate"]["coverage"])
    labeled = Store(world["env"]["SEMIF_DB"]).get_labeled_set(policy["dataset"]["set_id"])
    (ds,) = run.inputs.dataset_inputs
    assert ds.dataset.digest == labeled["content_hash"][:36] and tags["semif.dataset_sha256"] == labeled["content_hash"]
    assert tags["semif.run_id"] == str(policy["run_id"])  # back to the workbench run
    c = client(world)
    text = Path(c.download_artifacts(run.info.run_id, "policy/policy.json", str(world["tmp"]))).read_text()
    assert json.loads(text) == policy
    rows = Path(c.download_artifacts(run.info.run_id, "results.jsonl", str(world["tmp"]))).read_text().splitlines()
    assert len(rows) == 12 and {json.loads(r)["row_key"] for r in rows} == {
        r["id"] for r in map(json.loads, (world["tmp"] / "refund-small.jsonl").read_text().splitlines())}
    assert not (Path(world["env"]["CWD"]) / "mlflow.db").exists()  # nothing written where the command ran
    # the second command (--learning-curve): the policy logged is the file written, its learning curve included
    second = json.loads(world["policies"][1].read_text())
    assert "label_curve" in second["metrics"]
    logged = Path(c.download_artifacts(calibrations[0].info.run_id, "policy/policy.json", str(mkdir(world["tmp"] / "second"))))
    assert json.loads(logged.read_text()) == second


def test_the_pages_save_and_register_log_and_register_through_the_service(world, settings_env):
    from app.service import evaluate, queries, registry, tracking

    store = settings_env
    run_id = json.loads(world["policies"][0].read_text())["run_id"]
    exported = evaluate.export(store, evaluate.calibrate(store, run_id, head="none"), fallback="human-review")
    cid = evaluate.save(store, exported)  # what "Save for deployment" calls
    (where,) = tracking.where(store, f"calibrated #{cid}")
    assert where["status"] == "sent" and where["tracking_uri"] == world["uri"]
    got = client(world).get_run(where["mlflow_run_id"])
    assert got.data.tags["semif.calibrated_id"] == str(cid) and got.data.params["model_sha256"]
    assert f"run {where['mlflow_run_id']}" in tracking.link(where)
    assert queries.run(store, run_id) is not None
    reg = registry.register(store, cid)  # what "Register" calls
    assert reg.new and registry.resolve(f"models:/{reg.name}/{reg.version}", store=store).policy.policy_id == "refund-check"
    assert registry.register(store, cid).version == reg.version  # the same file twice: one version


def tiny_version(world, source: Path, name: str) -> tuple[Path, Path]:
    """A calibrated policy re-pointed at a tiny .gguf, so packaging it for a plan copies bytes, not a model
    (the registry and the plan are what is tested here; the packager checks the identity either way)."""
    gguf = world["tmp"] / "tiny.gguf"
    if not gguf.exists():
        gguf.write_bytes(b"GGUF" + b"\0" * 60)
    config = json.loads(source.read_text())
    config["model"] = {"file": gguf.name, "sha256": hashlib.sha256(gguf.read_bytes()).hexdigest()}
    out = world["tmp"] / name
    out.write_text(json.dumps(config))
    return out, gguf


def planned_policy(world, gguf: Path, work: Path, ref: str) -> tuple[dict, str]:
    got = run_app(world["env"], "deploy", "plan", "--serving", "semif", "--model", str(gguf), "--policy", ref,
                  "--work-dir", str(work), "--suffix", work.name)
    assert got.returncode == 0, got.stderr[-3000:]
    (tarball,) = work.rglob("model.tar.gz")
    with tarfile.open(tarball) as tar:
        member = tar.extractfile("policy.json")
        assert member is not None
        return json.loads(member.read()), got.stderr


def test_register_promote_plan_by_alias_rollback_plan_the_previous_version(world):
    env = world["env"]
    v1, gguf = tiny_version(world, world["policies"][0], "tiny-v1.json")
    v2, _ = tiny_version(world, world["policies"][1], "tiny-v2.json")
    assert run_app(env, "registry", "register", "--calibrated", str(v1)).returncode == 0
    promoted = run_app(env, "registry", "promote", "refund-check")
    assert promoted.returncode == 0, promoted.stderr
    first = promoted.stdout.strip().splitlines()[-1]
    registered = run_app(env, "registry", "register", "--calibrated", str(v2))
    assert registered.returncode == 0 and "@candidate" in registered.stdout, registered.stderr
    # the replayed rows were scored by SmolLM2, not by the versions' model: no replay, so it asks first
    refused = run_app(env, "registry", "promote", "refund-check")  # no terminal to ask on
    assert refused.returncode == 1 and "cannot be replayed" in refused.stderr and "--yes" in refused.stderr
    yes = run_app(env, "registry", "promote", "refund-check", "--yes")
    assert yes.returncode == 0 and "shadow check: replayed run" in yes.stdout, yes.stderr
    assert "confirmed" in run_app(env, "registry", "list", "refund-check").stdout
    now_v = yes.stdout.strip().splitlines()[-1].rsplit("v", 1)[1]
    planned, said = planned_policy(world, gguf, world["tmp"] / "plan-a", "models:/semif-refund-check@production")
    assert planned == json.loads(v2.read_text()) and f"v{now_v} ->" in said
    back = run_app(env, "registry", "rollback", "semif-refund-check")
    assert back.returncode == 0 and back.stdout.strip().endswith(first.rsplit(" ", 1)[1]), back.stdout + back.stderr
    planned, _ = planned_policy(world, gguf, world["tmp"] / "plan-b", "models:/semif-refund-check@production")
    assert planned == json.loads(v1.read_text())  # the image holds the previous version's file
    listed = run_app(env, "registry", "list", "refund-check").stdout
    assert "promote" in listed and "rollback" in listed and "(confirmed)" in listed  # audited in the workbench
    c = client(world)
    model = c.get_registered_model("semif-refund-check")
    assert json.loads(model.tags["semif.production_history"])[-1] == str(model.aliases["production"])
    assert "semif.shadow_check" in c.get_model_version("semif-refund-check", now_v).tags  # and in MLflow


def test_promotion_over_production_replays_rows_and_asks_beyond_the_tolerance(world, settings_env, monkeypatch,
                                                                               tmp_path):
    from adapter.policy import load_policy
    from app.service import registry

    a, b = (load_policy(p) for p in world["policies"])
    same = registry.shadow(settings_env, a, a, a.run_id or 0)
    assert same.rows == 12 and same.changed == 0 and same.unread == 0 and same.within and same.drift.flips == 0
    other = registry.shadow(settings_env, a, b, a.run_id or 0, tolerance=0.0)
    assert other.unread == 0 and all(r["production"] != r["candidate"] for r in other.examples)
    assert len(other.examples) == min(other.changed, 10)
    assert other.changed > 0 and not other.within  # the hand-set gate 0.5 decides rows the recommended one sends on
    monkeypatch.setenv("SEMIF_MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    first = registry.register(settings_env, str(world["policies"][0]))
    assert registry.promote(settings_env, "refund-check").previous is None
    second = registry.register(settings_env, str(world["policies"][1]))
    with pytest.raises(registry.NeedsConfirmation, match="beyond the tolerance") as asked:
        registry.promote(settings_env, "refund-check")
    assert asked.value.shadow is not None and asked.value.shadow.changed == other.changed
    assert registry.listing("refund-check")[0].aliases == ("candidate",)  # production did not move
    loose = registry.promote(settings_env, "refund-check", tolerance=1.0)  # within a stated tolerance: no question
    assert (loose.previous, loose.version) == (first.version, second.version) and loose.shadow is not None
    assert "McNemar" in loose.shadow.text() or "No labeled pairs" in loose.shadow.text()


def test_a_dead_tracker_is_one_warning_and_a_queue_that_sends_later(world, settings_env, monkeypatch, caplog, tmp_path):
    from app.core import tracking as core
    from app.service import evaluate, tracking

    later = tmp_path / "not-yet"
    monkeypatch.setenv("SEMIF_MLFLOW_TRACKING_URI", f"sqlite:///{later / 'mlflow.db'}")  # its folder is missing
    store = settings_env
    run_id = json.loads(world["policies"][0].read_text())["run_id"]
    exported = evaluate.export(store, evaluate.calibrate(store, run_id, head="none"))
    with caplog.at_level(logging.WARNING, logger="semif.tracking"):
        a, b = evaluate.save(store, exported), evaluate.save(store, exported)  # saved: the workbench goes on
    assert sum("cannot take runs now" in r.getMessage() for r in caplog.records) == 1
    assert [w["status"] for w in tracking.where(store, f"calibrated #{a}") + tracking.where(store, f"calibrated #{b}")] \
        == ["pending", "pending"]
    later.mkdir()  # the tracker is back: the next flush sends both, oldest first
    sent, waiting = tracking.flush(store)
    assert sent == 2 and waiting == core.pending(store) == 0
    (w,) = tracking.where(store, f"calibrated #{a}")
    from mlflow import MlflowClient

    assert MlflowClient(f"sqlite:///{later / 'mlflow.db'}").get_run(w["mlflow_run_id"]).data.tags["semif.calibrated_id"] \
        == str(a)
    with socket.socket() as s:  # an HTTP tracker nobody answers: refused at once, queued
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("SEMIF_MLFLOW_TRACKING_URI", dead)
    core._warned.discard(dead)
    c = evaluate.save(store, exported)
    assert tracking.where(store, f"calibrated #{c}")[0]["status"] == "pending"


def test_with_the_setting_off_nothing_imports_mlflow(world):
    code = ("import json, sys; from app.core.store import Store; from app.service import evaluate\n"
            f"s = Store({world['env']['SEMIF_DB']!r})\n"
            f"run_id = json.load(open({str(world['policies'][0])!r}))['run_id']\n"
            "e = evaluate.export(s, evaluate.calibrate(s, run_id, head='none'))\n"
            "cid = evaluate.save(s, e)\n"
            "print('mlflow' in sys.modules, cid)")
    env = {k: v for k, v in world["env"].items() if k != "SEMIF_MLFLOW_TRACKING_URI"}
    got = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    imported, cid = got.stdout.split()
    assert imported == "False"
    from app.core import tracking
    from app.core.store import Store

    assert tracking.where(Store(world["env"]["SEMIF_DB"]), f"calibrated #{cid}") == []


def test_bad_input_is_named_and_nothing_is_half_registered(world, settings_env, tmp_path, monkeypatch):
    from app.service import registry

    env = world["env"]
    bad = run_app({**env, "SEMIF_MLFLOW_TRACKING_URI": "mlflow-please"}, "registry", "list")
    assert bad.returncode == 2 and "SEMIF_MLFLOW_TRACKING_URI" in bad.stderr and "not an MLflow tracking URI" in bad.stderr
    off = run_app({k: v for k, v in env.items() if k != "SEMIF_MLFLOW_TRACKING_URI"}, "registry", "list")
    assert off.returncode == 2 and "set SEMIF_MLFLOW_TRACKING_URI" in off.stderr
    other = f"sqlite:///{tmp_path / 'other.db'}"  # a tracker where the name belongs to another policy
    monkeypatch.setenv("SEMIF_MLFLOW_TRACKING_URI", other)
    from mlflow import MlflowClient

    c = MlflowClient(other, registry_uri=other)
    c.create_registered_model("semif-refund-check", tags={"semif.policy_id": "someone-else"})
    with pytest.raises(registry.RegistryError, match="someone-else.*nothing registered"):
        registry.register(settings_env, str(world["policies"][0]))
    assert c.search_model_versions("name = 'semif-refund-check'") == []
    broken = json.loads(world["policies"][0].read_text())
    broken["threshold"] = 7  # the validator refuses it: nothing is written
    with pytest.raises(registry.RegistryError, match="threshold.*nothing registered"):
        registry.register(settings_env, broken)
    # a version that fails the validator (written around the workbench) is never resolved or promoted
    exp = c.create_experiment("elsewhere", artifact_location=(tmp_path / "art").as_uri())
    run = c.create_run(exp)
    c.log_text(run.info.run_id, json.dumps(broken), "policy/policy.json")
    c.create_registered_model("semif-x", tags={"semif.policy_id": "x"})
    c.create_model_version("semif-x", f"runs:/{run.info.run_id}/policy", run_id=run.info.run_id)
    c.set_registered_model_alias("semif-x", "candidate", "1")
    with pytest.raises(registry.RegistryError, match="threshold"):
        registry.resolve("models:/semif-x@candidate", store=settings_env)
    with pytest.raises(registry.RegistryError, match="threshold"):
        registry.promote(settings_env, "semif-x")
    assert "production" not in c.get_registered_model("semif-x").aliases
    with pytest.raises(registry.RegistryError, match="no such alias.*versions 1"):
        registry.resolve("models:/semif-x@production", store=settings_env)
    with pytest.raises(registry.RegistryError, match="not a registry reference"):
        registry.resolve("models:/semif-x", store=settings_env)
    # an alias whose model the deployment cannot load: the packager's check, named
    v1 = world["policies"][0]
    monkeypatch.setenv("SEMIF_MLFLOW_TRACKING_URI", world["uri"])
    gguf = tmp_path / "other.gguf"
    gguf.write_bytes(b"GGUF" + b"\1" * 60)
    got = run_app(env, "deploy", "plan", "--serving", "semif", "--model", str(gguf), "--policy",
                  "models:/semif-refund-check@production", "--work-dir", str(tmp_path / "w"))
    assert got.returncode == 2 and "not on the model being deployed" in got.stderr, got.stderr[-2000:]
    assert v1.exists()


def test_the_deploy_page_reads_a_policy_by_reference_and_history_shows_where_runs_went(world, settings_env):
    from streamlit.testing.v1 import AppTest

    from app.service import deploy, history

    production = deploy.from_registry(settings_env, "models:/semif-refund-check@production")  # the page's call
    with pytest.raises(ValueError, match="no such alias"):
        deploy.from_registry(settings_env, "models:/semif-refund-check@nope")
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120)
    at.run()
    at.switch_page("views/deploy.py").run()
    at.selectbox(key="dep_cal").select(-2).run()  # "from the MLflow registry (models:/…)…"
    at.text_input(key="dep_cal_ref").input("models:/semif-refund-check@production").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any(production["model"]["file"] in c.value.replace("\\", "") for c in at.caption)  # its model, said
    at.text_input(key="dep_cal_ref").input("models:/semif-refund-check@nope").run()
    assert any("no such alias" in e.value for e in at.error)
    run_id = json.loads(world["policies"][0].read_text())["run_id"]
    lines = history.mlflow(settings_env, run_id)  # what History shows under the run
    assert any(line.startswith("MLflow (calibration): sqlite:///") for line in lines)
    assert any(line.startswith("MLflow (evaluation): ") for line in lines)


def test_check_robustness_and_bench_take_the_same_reference(world, settings_env):
    from app.service import ci_check, heads, registry

    ref = "models:/semif-refund-check@production"
    resolved = registry.resolve(ref, store=settings_env)
    policy, calibrated = ci_check.check_policy(settings_env, ref)  # `app check --policy models:/...`
    assert calibrated is not None and calibrated == resolved.policy and policy["id"] == "refund-check"
    picked = heads.as_deployed(settings_env, ref)  # `--calibrated` of `app robustness` and `app bench`
    assert picked.config == resolved.policy.model_dump(mode="json") and picked.source == resolved.path.name
    with pytest.raises(ci_check.UsageError, match="--policy: .*no such version"):
        ci_check.check_policy(settings_env, "models:/semif-refund-check/99")
    # `app check` by reference on the command line, logged as a check run (stored results stand in for calls)
    got = run_app(world["env"], "check", "--policy", f"models:/semif-refund-check/{resolved.version}", "--labeled-set",
                  str(world["tmp"] / "refund-small.jsonl"), "--min-accuracy", "0.01")
    assert got.returncode in (0, 1), got.stderr[-2000:]
    (logged,) = runs_of(world, "check")
    assert "check.min-accuracy" in logged.data.metrics and logged.data.tags["semif.check_passed"] in ("True", "False")


def test_the_candidate_as_a_sagemaker_shadow_variant_is_a_validated_dry_run_plan(world, settings_env, tmp_path):
    """moto has no ShadowProductionVariants: the plan is validated offline (botocore's model, deploy's rules)."""
    from app.service import registry

    gguf = world["tmp"] / "tiny.gguf"  # the versions registered by the end-to-end test above
    cfg, steps, problems = registry.shadow_plan(settings_env, "refund-check", model=str(gguf), work_dir=tmp_path)
    assert problems == []
    (config,) = [s.params for s in steps if s.operation == "CreateEndpointConfig"]
    (shadow,) = config["ShadowProductionVariants"]
    models = {s.params["ModelName"]: s.params for s in steps if s.operation == "CreateModel"}
    assert shadow["ModelName"] in models and shadow["ModelName"] != config["ProductionVariants"][0]["ModelName"]
    urls = {m["PrimaryContainer"]["ModelDataUrl"] for m in models.values()}
    assert len(urls) == 2  # two packages: production's policy and the candidate's
    (cand_tar,) = (tmp_path / "candidate").rglob("model.tar.gz")
    with tarfile.open(cand_tar) as tar:
        inside = json.loads(tar.extractfile("policy.json").read())  # type: ignore[union-attr]
    assert inside == registry.resolve("models:/semif-refund-check@candidate", store=settings_env).policy.model_dump(
        mode="json")


def mkdir(path: Path) -> Path:
    path.mkdir(exist_ok=True)
    return path
