"""Issue 12, evaluation side: Batch Transform plans (pure, validated offline), and whole runs
against moto's server with tests/transform_runner.py doing the container's part on a real
adapter process: results come back one per row, in input order, keyed by id."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import Any

import boto3
import httpx
import pytest

from deploy.config import DeployConfig
from deploy.executor import DeployError, Executor, Timeouts
from deploy.package import build_package
from deploy.plan import Step
from deploy.transform import (adapter_environment, by_id, collect_results, output_key, prepare_transform,
                              transform_plan)
from deploy.validate import validate_plan
from tests.conftest import ROOT
from tests.transform_runner import JSONLINES, RunnerError, auto_run_transform_jobs, batches

REGION = "us-east-1"
BUCKET = "semif-test-models"
KB = 1000


def rows(n: int, start: int = 0) -> list[dict[str, Any]]:
    """Decision rows from the shipped ticket-routing set and policy (no few-shot: short prompts)."""
    policy = json.loads((ROOT / "data" / "policies" / "ticket-routing.json").read_text())
    labeled = [json.loads(l) for l in (ROOT / "data" / "labeled" / "ticket-routing.jsonl").read_text().splitlines() if l.strip()]
    return [{"id": r["id"], "state": r["state"], "question": policy["question"], "options": policy["options"]}
            for r in labeled[start:start + n]]


def cfg(**kw: Any) -> DeployConfig:
    base = dict(region=REGION, bucket=BUCKET, role_arn="arn:aws:iam::123456789012:role/sm", serving="textgen",
                name_suffix="tf")
    return DeployConfig(**{**base, **kw})


# -- pure ------------------------------------------------------------------------------------------------------
def test_prepare_and_plan_validate_offline(tmp_path):
    data = rows(7)
    job = prepare_transform(data, tmp_path, name="tf-pure", n_parts=3, model_name="my-model",
                            instance_type="ml.g4dn.xlarge", instance_count=3, max_concurrent_transforms=2,
                            max_payload_mb=2)
    assert [len(p.ids) for p in job.parts] == [2, 2, 3] and [i for p in job.parts for i in p.ids] == [r["id"] for r in data]
    first = (tmp_path / "tf-pure" / "part-00000.jsonl").read_text().splitlines()
    assert [json.loads(l) for l in first] == data[:2]  # one decision row per line
    again = prepare_transform(data, tmp_path / "b", name="tf-pure", n_parts=3, model_name="my-model")
    assert [p.sha256 for p in again.parts] == [p.sha256 for p in job.parts]  # deterministic input files
    c = cfg()
    steps = transform_plan(c, job)
    assert validate_plan(steps, REGION) == []
    assert [s.operation for s in steps] == ["PutObject"] * 3 + ["CreateTransformJob", "DescribeTransformJob"] + ["GetObject"] * 3
    p = next(s for s in steps if s.operation == "CreateTransformJob").params
    assert p["ModelName"] == "my-model" and p["MaxConcurrentTransforms"] == 2 and p["MaxPayloadInMB"] == 2
    assert p["BatchStrategy"] == "MultiRecord" and p["TransformResources"] == {"InstanceType": "ml.g4dn.xlarge",
                                                                              "InstanceCount": 3}
    assert p["TransformInput"]["SplitType"] == "Line" and p["TransformInput"]["ContentType"] == JSONLINES
    assert p["TransformInput"]["DataSource"]["S3DataSource"]["S3Uri"] == f"s3://{BUCKET}/models/semif/transform/tf-pure/input/"
    assert p["TransformOutput"] == {"S3OutputPath": f"s3://{BUCKET}/models/semif/transform/tf-pure/output/",
                                    "Accept": JSONLINES, "AssembleWith": "Line"}
    assert steps[-1].params["Key"] == "models/semif/transform/tf-pure/output/part-00002.jsonl.out" == output_key(job, job.parts[2])
    bad = Step(**{**steps[3].to_dict(), "params": {**p, "MaxConcurrentTransforms": "many"}})
    assert any("MaxConcurrentTransforms" in e for e in validate_plan([bad], REGION))
    # no model name: the model is created from the package, first
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 64)
    pkg = build_package(c, tmp_path / "w", gguf=gguf)
    own = prepare_transform(data, tmp_path / "own", name="tf-own")
    ops = [s.operation for s in transform_plan(c, own, pkg)]
    assert ops[:2] == ["PutObject", "CreateModel"] and validate_plan(transform_plan(c, own, pkg), REGION) == []
    assert next(s for s in transform_plan(c, own, pkg) if s.operation == "CreateTransformJob").params["ModelName"] == c.model_name
    with pytest.raises(ValueError, match="package"):
        transform_plan(c, own)



def test_a_job_that_reuses_a_model_needs_no_role(tmp_path):
    """A transform job on an existing model: region and bucket only (no DeployConfig, no role ARN)."""
    from deploy.config import BUCKET_PLACEHOLDER, FormErrors
    from deploy.transform import TransformSite, site_from_form

    job = prepare_transform(rows(3), tmp_path, name="tf-site", model_name="my-model")
    site = site_from_form({"region": REGION, "bucket": BUCKET})
    assert site == TransformSite(REGION, BUCKET, "models/semif")
    steps = transform_plan(site, job)
    assert validate_plan(steps, REGION) == [] and "role" not in json.dumps([s.params for s in steps]).lower()
    untagged = [{k: v for k, v in s.params.items() if k != "Tags"} for s in steps]
    assert untagged == [{k: v for k, v in s.params.items() if k != "Tags"} for s in transform_plan(cfg(), job)]
    assert next(s for s in steps if s.operation == "CreateTransformJob").params["Tags"] == site.tags()
    with pytest.raises(ValueError, match="no model name to reuse"):
        transform_plan(site, prepare_transform(rows(1), tmp_path / "own", name="tf-own"))  # creating one needs a role
    with pytest.raises(FormErrors) as err:
        site_from_form({"region": "Mars", "bucket": ""})
    assert set(err.value.errors) == {"region", "bucket"} and "required" in err.value.errors["bucket"]
    assert site_from_form({"region": REGION}, placeholders=True).bucket == BUCKET_PLACEHOLDER


def test_bad_rows_are_named(tmp_path):
    with pytest.raises(ValueError) as e:
        prepare_transform([{"id": "a"}, {"state": "x"}, {"id": "a"}, {"id": 3}], tmp_path, name="tf-bad")
    assert "row 2: needs a non-empty string id" in str(e.value) and "row 3: duplicate id 'a'" in str(e.value)
    assert "row 4" in str(e.value)
    with pytest.raises(ValueError, match="no rows"):
        prepare_transform([], tmp_path, name="tf-empty")
    with pytest.raises(ValueError, match="job name"):
        prepare_transform(rows(1), tmp_path, name="bad_name!")


def test_adapter_environment_allows_the_largest_batch_by_hand():
    lines = [b"x" * 999] * 2000  # 1,000 bytes with the newline: 1,048 fit in 1 MiB (1,048,576 bytes)
    env = adapter_environment(lines, [4] * 2000, 1, "MultiRecord")
    assert env["SM_SEMIF_MAX_ROWS"] == "1048" and env["SM_SEMIF_MAX_COST"] == str(1048 * 4)
    assert env["SM_SEMIF_REQUEST_TIMEOUT"] == "3600"
    assert adapter_environment(lines, [4] * 2000, 1, "SingleRecord")["SM_SEMIF_MAX_ROWS"] == "256"  # default stays


def test_results_come_back_in_order_with_their_ids(tmp_path):
    job = prepare_transform(rows(3), tmp_path, name="tf-collect", model_name="m")
    steps = transform_plan(cfg(), job)
    key = output_key(job, job.parts[0])
    ids = list(job.parts[0].ids)
    out = collect_results(job, steps, {key: [{"id": ids[0], "top_option": "a"}, {"top_option": "b"},
                                             {"id": ids[2], "error": {"status": 422, "detail": []}}]})
    assert [r["id"] for r in out] == ids and out[2]["error"]["status"] == 422  # an error object keeps its place
    assert set(by_id(out)) == set(ids)
    with pytest.raises(DeployError, match="2 lines for 3 rows"):
        collect_results(job, steps, {key: [{"id": ids[0]}, {"id": ids[1]}]})
    with pytest.raises(DeployError, match="expected"):
        collect_results(job, steps, {key: [{"id": ids[1]}, {"id": ids[0]}, {"id": ids[2]}]})
    with pytest.raises(DeployError, match="no output"):
        collect_results(job, steps, {})


def test_runner_batches_like_sagemaker():
    recs = [b"a" * 600 * KB, b"b" * 400 * KB, b"c" * 100 * KB, b"d" * 900 * KB]
    assert [[len(r) // KB for r in b] for b in batches(recs, 1, "MultiRecord")] == [[600, 400], [100, 900]]
    assert len(batches(recs, 1, "SingleRecord")) == 4
    assert [[len(r) // KB for r in b] for b in batches(recs, 2, "MultiRecord")] == [[600, 400, 100, 900]]  # 2,000,003 B
    with pytest.raises(RunnerError, match="exceeds MaxPayloadInMB"):
        batches([b"x" * 2 * 1024 * 1024], 1, "MultiRecord")


# -- against moto's server and a real adapter process -------------------------------------------------------------
@pytest.fixture(scope="module")
def content_type(adapter_server) -> str:
    """The Batch Transform contract the adapter speaks: asserted, so that losing it fails the tests
    instead of quietly testing JSON arrays."""
    params = httpx.get(adapter_server.url + "/execution-parameters", timeout=30)
    assert params.status_code == 200 and params.json()["BatchStrategy"] == "MULTI_RECORD", params.text
    return JSONLINES


@pytest.fixture
def model_name(aws_env) -> str:
    sm = boto3.client("sagemaker", region_name=REGION, endpoint_url=aws_env)
    try:
        sm.create_model(ModelName="tf-model", ExecutionRoleArn="arn:aws:iam::123456789012:role/sm",
                        PrimaryContainer={"Image": "x", "ModelDataUrl": f"s3://{BUCKET}/m.tar.gz"})
    except sm.exceptions.ClientError:
        pass  # made by an earlier test on this shared server
    return "tf-model"


def direct(adapter_url: str, data: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in httpx.post(adapter_url + "/invocations", json=data, timeout=300).json()}


def test_transform_runs_and_resumes_against_moto(aws_env, adapter_server, content_type, model_name, tmp_path):
    data = rows(3, start=3)  # few rows: this is about the mechanics, and each decision costs real CPU
    gate = threading.Event()
    events: list[dict[str, Any]] = []

    def on_event(e: dict[str, Any]) -> None:
        events.append(e)
        if e.get("phase") == "wait" and "InProgress" in e["message"]:
            gate.set()  # the runner writes outputs only once the executor has seen the job running

    ex = Executor(REGION, endpoint_url=aws_env, poll_seconds=0.02, on_event=on_event, timeouts=Timeouts(transform=300))
    merged: dict[str, Any] = {}
    with auto_run_transform_jobs(aws_env, adapter_server.url, content_type=content_type, gate=gate) as finished:
        first = prepare_transform(data[:2], tmp_path, name="tf-run-a", model_name=model_name, instance_count=2)
        out = ex.run_transform(cfg(), first)
        assert [r["id"] for r in out] == [r["id"] for r in data[:2]]  # input order across both files
        merged.update(by_id(out))
        gate.clear()
        rest = [r for r in data if r["id"] not in merged]  # resume: only the rows without a result
        second = prepare_transform(rest, tmp_path, name="tf-run-b", model_name=model_name)
        merged.update(by_id(ex.run_transform(cfg(), second)))
    assert finished == [("tf-run-a", "Completed"), ("tf-run-b", "Completed")]
    waits = [e["message"] for e in events if e.get("phase") == "wait"]
    assert any("InProgress, 0/2 output files" in w for w in waits), waits  # progress while it ran
    reference = direct(adapter_server.url, data)
    assert list(merged) == [r["id"] for r in data]
    for rid, got in merged.items():
        assert got["option_ids"] == reference[rid]["option_ids"] and got["top_option"] == reference[rid]["top_option"]
        assert got["probabilities"] == pytest.approx(reference[rid]["probabilities"], abs=0.02)
    s3 = boto3.client("s3", region_name=REGION, endpoint_url=aws_env)
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="models/semif/transform/tf-run-a/output/")
    assert sorted(o["Key"].rsplit("/", 1)[1] for o in listed["Contents"]) == ["part-00000.jsonl.out", "part-00001.jsonl.out"]
    sm = boto3.client("sagemaker", region_name=REGION, endpoint_url=aws_env)
    assert sm.describe_transform_job(TransformJobName="tf-run-a")["TransformJobStatus"] == "Completed"


def test_a_failed_job_is_a_clear_error(aws_env, adapter_server, model_name, tmp_path):
    ex = Executor(REGION, endpoint_url=aws_env, poll_seconds=0.02, timeouts=Timeouts(transform=300))
    job = prepare_transform(rows(1), tmp_path, name="tf-fail", model_name=model_name)
    with auto_run_transform_jobs(aws_env, adapter_server.url, content_type="text/csv") as finished:
        with pytest.raises(DeployError, match="(?s)transform job tf-fail failed: .*415"):
            ex.run_transform(cfg(), job)
    assert finished == [("tf-fail", "Failed")]


def test_transform_creates_the_model_from_the_package(aws_env, adapter_server, content_type, tmp_path):
    c = cfg(name_suffix="tfpkg")
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF" + b"\2" * 128)
    pkg = build_package(c, tmp_path / "w", gguf=gguf)
    ex = Executor(REGION, endpoint_url=aws_env, poll_seconds=0.02, timeouts=Timeouts(transform=300))
    with auto_run_transform_jobs(aws_env, adapter_server.url, content_type=content_type):
        out = ex.run_transform(c, prepare_transform(rows(1), tmp_path, name="tf-pkg"), pkg=pkg)
    assert [r["id"] for r in out] == [r["id"] for r in rows(1)] and "probabilities" in out[0]
    sm = boto3.client("sagemaker", region_name=REGION, endpoint_url=aws_env)
    assert sm.describe_model(ModelName=c.model_name)["PrimaryContainer"]["ModelDataUrl"] == f"s3://{BUCKET}/{pkg.key}"
    assert sm.describe_transform_job(TransformJobName="tf-pkg")["ModelName"] == c.model_name


def test_cli_transform_dry_run_and_run(aws_env, adapter_server, content_type, model_name, tmp_path):
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows(2, start=10)))
    base = [sys.executable, "-m", "deploy", "transform", "--input", str(src), "--model-name", model_name,
            "--bucket", BUCKET, "--work-dir", str(tmp_path / "w"), "--endpoint-url", aws_env, "--poll", "0.02"]
    dry = subprocess.run([*base, "--job-name", "tf-cli-dry", "--dry-run", "--instance-type", "ml.g4dn.xlarge"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    job_call = next(c for c in plan["calls"] if c["call"] == "sagemaker.CreateTransformJob")
    assert plan["rows"] == 2 and job_call["params"]["TransformResources"]["InstanceType"] == "ml.g4dn.xlarge"
    sm = boto3.client("sagemaker", region_name=REGION, endpoint_url=aws_env)
    with pytest.raises(sm.exceptions.ClientError):
        sm.describe_transform_job(TransformJobName="tf-cli-dry")  # a dry run calls nothing
    with auto_run_transform_jobs(aws_env, adapter_server.url, content_type=content_type):
        run = subprocess.run([*base, "--job-name", "tf-cli"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    results = [json.loads(l) for l in run.stdout.splitlines()]
    assert [r["id"] for r in results] == [r["id"] for r in rows(2, start=10)] and all("top_option" in r for r in results)
    bad = subprocess.run([*base[:5], str(tmp_path / "nope.jsonl"), *base[6:], "--dry-run"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "cannot plan" in bad.stderr


def test_a_bad_row_gets_an_error_line_in_its_place(aws_env, adapter_server, content_type, model_name, tmp_path):
    """The jsonlines contract: one error object in place of the bad row's result, the job completes."""
    data = rows(3, start=20)
    data[1] = {**data[1], "options": data[1]["options"][:1]}  # one option: 422 for this row only
    ex = Executor(REGION, endpoint_url=aws_env, poll_seconds=0.02, timeouts=Timeouts(transform=300))
    with auto_run_transform_jobs(aws_env, adapter_server.url, content_type=JSONLINES):
        out = ex.run_transform(cfg(), prepare_transform(data, tmp_path, name="tf-err", model_name=model_name))
    assert [r["id"] for r in out] == [r["id"] for r in data]
    assert out[1]["error"]["status"] == 422 and out[1]["error"]["detail"]
    assert "probabilities" in out[0] and "probabilities" in out[2]
