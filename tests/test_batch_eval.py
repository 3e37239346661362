"""A labeled set evaluated through SageMaker Batch Transform (moto's server + the local transform
runner posting JSON Lines to a real adapter process), from the CLI and from the Calibrate page:
the run is an evaluation like any other, equal to the local one, and resumable row by row."""
from __future__ import annotations

import subprocess
import sys

import boto3
import pytest
from streamlit.testing.v1 import AppTest

from adapter.engine.templates import load_template
from app.core import runs
from app.targets.engines import EnginePool
from app.core.labeled import import_file
from app.core.store import Store
from app.targets.registry import target_by_name
from tests.conftest import REGION, ROOT, subset_file, finish_tasks
from tests.transform_runner import JSONLINES, auto_run_transform_jobs

MODEL = "semif-eval-model"


@pytest.fixture
def batch(aws_env, adapter_server, tmp_path, monkeypatch):
    """A store with the refund policy, an 8-row set, a Batch Transform target and a local one."""
    sm = boto3.client("sagemaker", region_name=REGION, endpoint_url=aws_env)
    if MODEL not in [m["ModelName"] for m in sm.list_models()["Models"]]:
        sm.create_model(ModelName=MODEL, ExecutionRoleArn="arn:aws:iam::123456789012:role/sm",
                        PrimaryContainer={"Image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/semif-adapter:src-x"})
    db_path = tmp_path / "wb.db"
    monkeypatch.setenv("SEMIF_DB", str(db_path))
    db = Store(db_path)
    policy = load_template("refund-check")
    db.save_policy(policy)
    path = subset_file(tmp_path, "refund-check", 8)
    set_id = import_file(db, path.name, path.read_bytes(), policy)
    monkeypatch.setenv("SEMIF_AWS_ENDPOINT_URL", aws_env)  # the operator's setting: a target's config cannot say
    monkeypatch.setenv("SEMIF_DEPLOY_POLL", "0.05")
    db.save_target("batch", "sagemaker-batch", {"model_name": MODEL, "bucket": "semif-test-models", "region": REGION})
    with auto_run_transform_jobs(aws_env, adapter_server.url, content_type=JSONLINES) as jobs:
        yield db, policy, set_id, jobs


def local_probabilities(db, policy, set_id) -> dict[str, list[float]]:
    target = target_by_name(db, "local", EnginePool())
    run_id, _ = runs.find_or_start(db, policy=policy, set_id=set_id, target=target)
    runs.resume_eval(db, run_id, target, reuse=False)  # scored here: not copied from the batch job's results
    return {r["row_key"]: r["probabilities"] for r in db.results(run_id)}


def test_cli_batch_transform_equals_the_local_evaluation_and_resumes_row_by_row(batch):
    db, policy, set_id, jobs = batch
    target = target_by_name(db, "batch", EnginePool())
    run_id, _ = runs.find_or_start(db, policy=policy, set_id=set_id, target=target)

    def stop_after_three(done, total, eta):  # a worker killed while it ingests the job's results
        if done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        runs.resume_eval(db, run_id, target, stop_after_three)
    first = {r["row_key"]: r["id"] for r in db.results(run_id)}
    assert len(first) == 3 and db.get_run(run_id)["status"] == "interrupted"
    # resumed from the command line: only the 5 missing rows go into a second job
    out = subprocess.run([sys.executable, "-m", "app", "calibrate", "--db", str(db.path), "--policy", "refund-check",
                          "--labeled-set", str(set_id), "--target", "batch", "--quiet"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "resumed" in out.stderr and "scored 5 rows (5 evaluated" in out.stderr and "reused 3 already" in out.stderr
    results = db.results(run_id)
    assert len(results) == 8 == len({r["row_key"] for r in results}) and not any(r["error"] for r in results)
    assert {k: v for k, v in ((r["row_key"], r["id"]) for r in results) if k in first} == first  # not re-ingested
    assert [status for _, status in jobs] == ["Completed", "Completed"]
    assert {r["row_key"]: r["probabilities"] for r in results} == local_probabilities(db, policy, set_id)
    assert "accuracy" in out.stdout  # the same metrics as any evaluation run


def test_calibrate_page_runs_a_batch_transform_evaluation(batch):
    db, policy, set_id, jobs = batch
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=180)
    at.run()
    at.switch_page("views/calibrate.py").run()
    at.selectbox(key="cal_policy").select("refund-check").run()
    at.selectbox(key="cal_set").select(set_id).run()
    at.multiselect(key="cal_targets").set_value(["batch"]).run()
    finish_tasks(at.button(key="cal_run").click().run())
    assert not at.exception and not any("Batch Transform" in e.value for e in at.error), [e.value for e in at.error]
    (run,) = db.list_runs(kind="eval")
    assert run["target_name"] == "batch" and run["status"] == "done" and len(db.results(run["id"])) == 8
    assert jobs and jobs[-1][1] == "Completed"
    assert any(m.label == "Accuracy, model alone (uncorrected)" for m in at.metric)  # calibrated like a local run
