"""Issue 13: the plan a person confirms is the plan that runs. Packaging comes first, apply runs
exactly the given steps (refusing an invalid or stale one), the recorder gets the executed plan,
every wait is bounded, form input becomes a config in one place, and deploy/ never imports app/."""
from __future__ import annotations

import ast
import json
import math
from typing import Any, get_args

import boto3
import pytest
from botocore.exceptions import ClientError

from deploy.config import ACCOUNT_PLACEHOLDER, SERVINGS, Compute, DeployConfig, FormErrors, Serving, config_from_form
from deploy.executor import DeployError, Executor, Timeouts
from deploy.package import build_package, sha256_file
from deploy.plan import Action, Step, bind_account, deployment_plan, image_tag, placeholders
from deploy.validate import validate_plan
from tests.conftest import ROOT

REGION = "us-east-1"
BUCKET = "semif-test-models"
ROLE = "arn:aws:iam::123456789012:role/sm"


def cfg(**kw: Any) -> DeployConfig:
    base = dict(region=REGION, bucket=BUCKET, role_arn="arn:aws:iam::123456789012:role/sm",
                codebuild_role_arn="arn:aws:iam::123456789012:role/cb", name_suffix="p1",
                instance_type="ml.c5.xlarge")  # in moto's (stale) list of instance types
    return DeployConfig(**{**base, **kw})


@pytest.fixture
def tiny_gguf(tmp_path):
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    return path


class ListRecorder:
    """A Recorder that keeps what it is told, to compare with what AWS saw."""

    def __init__(self) -> None:
        self.plans: list[list[Step]] = []
        self.results: list[tuple[str, str, str, str]] = []

    def planned(self, cfg: DeployConfig, steps: list[Step]) -> None:
        self.plans.append([Step.from_dict(s.to_dict()) for s in steps])

    def finished(self, deployment_id: str, action: str, status: str, detail: str) -> None:
        self.results.append((deployment_id, action, status, detail))


def test_package_first_then_a_plan_with_real_checksums(tiny_gguf, tmp_path):
    c = cfg(compute="gpu", account_id="123456789012")
    pkg = build_package(c, tmp_path / "work", gguf=tiny_gguf)
    assert pkg == build_package(c, tmp_path / "work", gguf=tiny_gguf)  # deterministic: same inputs, same package
    assert sha256_file(__import__("pathlib").Path(pkg.model_file)) == pkg.sha256 and len(pkg.source_sha256) == 64
    steps = deployment_plan(c, pkg)
    assert validate_plan(steps, REGION) == [] and not placeholders([s.params for s in steps])
    uploads = {s.extra["what"]: s for s in steps if s.action == "upload"}
    assert uploads["model"].params["Metadata"] == {"sha256": pkg.sha256}
    assert uploads["source"].params["Metadata"] == {"sha256": pkg.source_sha256}
    tag = "src-" + pkg.source_sha256[:12]
    image = next(s for s in steps if s.operation == "CreateModel").params["PrimaryContainer"]["Image"]
    assert image == f"123456789012.dkr.ecr.{REGION}.amazonaws.com/semif-adapter:{tag}" and image_tag(pkg) == tag
    build_env = {e["name"]: e["value"] for e in next(s for s in steps if s.operation == "StartBuild")
                 .params["environmentVariablesOverride"]}
    assert build_env["IMAGE_TAG"] == tag
    textgen = cfg(serving="textgen")
    assert build_package(textgen, tmp_path / "work", gguf=tiny_gguf).source_key == ""  # no image to build


def test_unfilled_placeholders_and_bad_operations_are_plan_errors(tiny_gguf, tmp_path):
    c = cfg()  # semif: the image URI needs the account id, unknown before STS
    steps = deployment_plan(c, build_package(c, tmp_path, gguf=tiny_gguf))
    errs = validate_plan(steps, REGION)
    assert errs and all(ACCOUNT_PLACEHOLDER in e for e in errs)
    assert validate_plan(steps, REGION, allow_account_placeholder=True) == []
    bound = bind_account(steps, "123456789012")
    assert validate_plan(bound, REGION) == [] and ACCOUNT_PLACEHOLDER in json.dumps([s.params for s in steps])
    assert [s.operation for s in bound] == [s.operation for s in steps]  # the same calls, one value filled
    assert any("not a botocore operation" in e for e in validate_plan([Step("sagemaker", "LaunchRocket", {}, "x")]))


def test_names_are_typed_literals():
    assert get_args(Serving) == ("textgen", "semif") == SERVINGS and get_args(Compute) == ("cpu", "gpu")
    assert "wait-transform" in get_args(Action) and Step("s3", "GetObject", {}, "x").action == "call"
    c = cfg(serving="textgen")
    assert c.deployment_id.startswith("textgen-") and {"Key": "semif:path", "Value": "textgen"} in c.tags()
    again = DeployConfig.from_dict(json.loads(json.dumps(c.to_dict())))
    assert again == c and isinstance(again.pools[0], tuple)
    legacy = {k: v for k, v in c.to_dict().items() if k != "serving"} | {"path": "textgen"}  # records before the rename
    assert DeployConfig.from_dict(legacy).serving == "textgen"


# -- the form: one pure function for the CLI and the Deploy page ------------------------------------------
FORM = {"region": "us-east-1", "bucket": "my-models", "role_arn": "arn:aws:iam::123456789012:role/sm",
        "codebuild_role_arn": "arn:aws:iam::123456789012:role/cb"}


def test_form_to_config_and_field_named_errors():
    c = config_from_form({**FORM, "serving": "semif", "compute": "gpu", "suffix": "f1",
                          "pools": [{"instance_type": "ml.g6.xlarge", "priority": 1.0},
                                    {"instance_type": " ml.g5.xlarge ", "priority": 2},
                                    {"instance_type": None, "priority": math.nan}]})  # the page's table rows
    assert c.pools == [("ml.g6.xlarge", 1), ("ml.g5.xlarge", 2)] and c.deployment_id == "semif-gpu-f1"
    assert c.account_id == ACCOUNT_PLACEHOLDER and c.autoscaling is None
    assert config_from_form({**FORM, "pools": ["ml.g6.xlarge:1"], "compute": "gpu"}).pools == [("ml.g6.xlarge", 1)]
    with pytest.raises(FormErrors) as e:
        config_from_form({"region": "Mars", "role_arn": "sm", "serving": "semif", "pools": ["ml.g5.xlarge:x"],
                          "instance_count": "two", "startup_timeout": "5", "autoscale_max": 2, "autoscale_min": 3})
    errs = e.value.errors
    assert set(errs) >= {"region", "bucket", "role_arn", "codebuild_role_arn", "pools", "instance_count",
                         "startup_timeout", "autoscale_min"}
    assert "CodeBuild role ARN" in errs["codebuild_role_arn"] and "required" in errs["bucket"]
    assert "ContainerStartupHealthCheckTimeoutInSeconds" in errs["startup_timeout"]
    assert "TYPE:PRIORITY" in errs["pools"]
    # a prebuilt image needs no CodeBuild role; a text-gen deployment neither
    assert config_from_form({**FORM, "codebuild_role_arn": "", "image_uri": "1.dkr.ecr.us-east-1.amazonaws.com/x:1"})
    assert config_from_form({**FORM, "codebuild_role_arn": "", "serving": "textgen"}).serving == "textgen"
    a = config_from_form({**FORM, "autoscale_max": "4", "decisions_per_second": "2.5", "instance_count": 2}).autoscaling
    assert a is not None and (a.min_instances, a.max_instances, a.decisions_per_second) == (1, 4, 2.5)
    # a measured pace without autoscaling prices the plan too (Deploy showed 9/s in the field and priced at the
    # family default 0.5/s, asking to "enter it above" - seen in the pool walkthrough, docs/review.md)
    from deploy.autoscaling import decisions_per_second

    alone = config_from_form({**FORM, "decisions_per_second": "9"})
    assert alone.autoscaling is None and decisions_per_second(alone) == 9.0
    assert decisions_per_second(DeployConfig.from_dict(alone.to_dict())) == 9.0  # kept with the plan
    assert decisions_per_second(config_from_form(FORM)) == 0.5  # nothing measured: the family's default
    from app.service.deploy import Planned  # and the plan says which it priced at (it said "enter it above")

    def priced(cfg: DeployConfig) -> str:
        return " ".join(Planned(cfg, None, [], []).cost_lines())  # type: ignore[arg-type]  # the cost needs no package

    assert "at 9 decisions/s per instance (your measurement)" in priced(alone)
    assert "at 0.5 decisions/s per instance (the instance family's default" in priced(config_from_form(FORM))
    with pytest.raises(FormErrors, match="instance_count"):
        config_from_form({**FORM, "autoscale_max": 2, "instance_count": 3})


# -- apply runs the given plan, records exactly it ----------------------------------------------------------
def test_apply_with_a_given_package_records_exactly_what_ran(aws_env, tiny_gguf, tmp_path):
    """Before: apply(cfg, pkg=...) crashed (no files), and the recorded plan said '<computed at apply>'."""
    c = cfg(name_suffix="given1", repository="semif-adapter-given", project="semif-adapter-build-given")
    pkg = build_package(c, tmp_path / "work", gguf=tiny_gguf)
    confirmed = deployment_plan(c, pkg)  # what the page shows before any AWS call: <account-id> still open
    assert validate_plan(confirmed, REGION, allow_account_placeholder=True) == []
    rec = ListRecorder()
    ex = Executor(REGION, endpoint_url=aws_env, poll_seconds=0.01, work_dir=tmp_path / "unused", recorder=rec)
    out = ex.apply(c, confirmed, pkg)
    assert out["status"]["status"] == "InService" and not (tmp_path / "unused").exists()  # packaged once, before
    (recorded,) = rec.plans
    assert [s.to_dict() for s in recorded] == out["plan"] == [s.to_dict() for s in bind_account(confirmed, "123456789012")]
    assert [d["operation"] for d in out["steps"]] == [s.operation for s in recorded]  # one result per recorded call
    s3 = boto3.client("s3", region_name=REGION, endpoint_url=aws_env)
    sm = boto3.client("sagemaker", region_name=REGION, endpoint_url=aws_env)
    put = {s.extra["what"]: s.params for s in recorded if s.action == "upload"}
    for what, sha in (("model", pkg.sha256), ("source", pkg.source_sha256)):
        head = s3.head_object(Bucket=BUCKET, Key=put[what]["Key"])
        assert head["Metadata"]["sha256"] == put[what]["Metadata"]["sha256"] == sha
    image = sm.describe_model(ModelName=c.model_name)["PrimaryContainer"]["Image"]
    recorded_model = next(s for s in recorded if s.operation == "CreateModel").params
    assert image == recorded_model["PrimaryContainer"]["Image"] == out["image"]
    assert image.endswith(":src-" + pkg.source_sha256[:12]) and "<" not in image
    build = boto3.client("codebuild", region_name=REGION, endpoint_url=aws_env)
    project = build.batch_get_projects(names=["semif-adapter-build-given"])["projects"][0]
    assert project["source"]["location"] == f"{BUCKET}/{pkg.source_key}"
    assert rec.results[-1][:3] == (c.deployment_id, "apply", "InService")
    assert json.loads(rec.results[-1][3])["model_sha256"] == pkg.sha256
    ex.destroy(c.endpoint_name, c.endpoint_config_name, c.model_name)
    assert rec.results[-1][1:3] == ("destroy", "deleted")


def test_apply_refuses_an_invalid_or_stale_plan_and_calls_nothing(aws_env, tiny_gguf, tmp_path):
    c = cfg(serving="textgen", name_suffix="refuse1")
    pkg = build_package(c, tmp_path, gguf=tiny_gguf)
    steps = deployment_plan(c, pkg)
    next(s for s in steps if s.operation == "CreateEndpointConfig").params["ProductionVariants"][0][
        "InitialInstanceCount"] = "one"
    rec = ListRecorder()
    ex = Executor(REGION, endpoint_url=aws_env, poll_seconds=0.01, recorder=rec)
    with pytest.raises(DeployError, match="(?s)invalid, nothing was called.*InitialInstanceCount"):
        ex.apply(c, steps, pkg)
    sm = boto3.client("sagemaker", region_name=REGION, endpoint_url=aws_env)
    with pytest.raises(ClientError):
        sm.describe_model(ModelName=c.model_name)
    # nothing was called, and the refused attempt is on record as failed, with the reason
    assert [r[1:3] for r in rec.results] == [("apply", "failed")] and "InitialInstanceCount" in rec.results[0][3]
    with pytest.raises(DeployError, match="does not create"):  # a plan made for another configuration
        ex.apply(cfg(serving="textgen", name_suffix="other1"), deployment_plan(c, pkg), pkg)
    # the file changed after the plan was confirmed: refused at its upload, before anything is created
    with open(pkg.model_file, "ab") as f:
        f.write(b"tampered")
    with pytest.raises(DeployError, match="changed since the plan was made"):
        ex.apply(c, deployment_plan(c, pkg), pkg)
    s3 = boto3.client("s3", region_name=REGION, endpoint_url=aws_env)
    with pytest.raises(ClientError):
        s3.head_object(Bucket=BUCKET, Key=pkg.key)
    assert rec.results[-1][1:3] == ("apply", "failed")


def test_every_wait_is_bounded_and_failures_are_explained():
    ex = Executor(REGION, endpoint_url="http://127.0.0.1:9", poll_seconds=0.0, timeouts=Timeouts(endpoint=0))
    seen: list[str] = []
    ex.on_event = lambda e: seen.append(e["message"])
    with pytest.raises(DeployError, match="did not finish within 0 s.*Creating"):
        ex._wait_until(lambda: (False, "Creating"), 0, "endpoint e")
    assert seen == ["endpoint e: Creating after 0 s"]
    calls = iter([(False, "Creating"), (True, "InService")])
    assert ex._wait_until(lambda: next(calls), 5, "endpoint e") == "InService"

    def failing() -> tuple[bool, str]:
        raise DeployError("the endpoint failed: no capacity")

    with pytest.raises(DeployError, match="no capacity"):
        ex._wait_until(failing, 5, "endpoint e")
    with pytest.raises(DeployError, match="does not know step"):
        ex.run_steps([Step("sagemaker", "DescribeEndpoint", {"EndpointName": "e"}, "x", action="wait-forever")])  # type: ignore[arg-type]


def test_endpoint_wait_uses_its_timeout_against_moto(aws_env, monkeypatch):
    """moto creates endpoints InService at once; here it reports Creating forever, and the
    configured timeout ends the wait with a clear error (before: _wait_endpoint had no timeout)."""
    from moto.sagemaker import models

    sm = boto3.client("sagemaker", region_name=REGION, endpoint_url=aws_env)
    sm.create_model(ModelName="slow-model", ExecutionRoleArn="arn:aws:iam::123456789012:role/sm",
                    PrimaryContainer={"Image": "x"})
    sm.create_endpoint_config(EndpointConfigName="slow-config", ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": "slow-model", "InitialInstanceCount": 1, "InstanceType": "ml.c5.xlarge"}])
    sm.create_endpoint(EndpointName="slow-ep", EndpointConfigName="slow-config")
    backend = models.sagemaker_backends["123456789012"][REGION]
    monkeypatch.setattr(backend.endpoints["slow-ep"], "endpoint_status", "Creating")
    ex = Executor(REGION, endpoint_url=aws_env, poll_seconds=0.01, timeouts=Timeouts(endpoint=0.05))
    with pytest.raises(DeployError, match="endpoint slow-ep did not finish within 0.05 s.*Creating"):
        ex.run_steps([Step("sagemaker", "DescribeEndpoint", {"EndpointName": "slow-ep"}, "wait", action="wait-endpoint")])
    monkeypatch.setattr(backend.endpoints["slow-ep"], "endpoint_status", "Failed")
    monkeypatch.setattr(backend.endpoints["slow-ep"], "failure_reason", "CapacityError: no ml.c5.xlarge", raising=False)
    with pytest.raises(DeployError, match="the endpoint failed: CapacityError"):
        ex.run_steps([Step("sagemaker", "DescribeEndpoint", {"EndpointName": "slow-ep"}, "wait", action="wait-endpoint")])


def test_deploy_does_not_import_the_workbench():
    """No cycle: deploy/ stands alone; the workbench hands its ledger to deploy's CLI (app.deploy_records)."""
    for path in sorted((ROOT / "deploy").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "app" or n.startswith("app.") for n in names), f"{path.name} imports {names}"


def test_cli_records_the_plan_it_ran(aws_env, tiny_gguf, tmp_path):
    import subprocess
    import sys

    db = tmp_path / "wb.db"
    args = [sys.executable, "-m", "app", "deploy", "apply", "--path", "textgen", "--bucket", BUCKET, "--suffix", "clirec1",
            "--instance-type", "ml.c5.xlarge", "--model", str(tiny_gguf), "--work-dir", str(tmp_path / "w"),
            "--endpoint-url", aws_env, "--poll", "0.01", "--db", str(db), "--role-arn", ROLE]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    from app.core.store import Store

    dep = Store(db).get_deployment("textgen-cpu-clirec1")
    assert dep["plan"] == json.loads(done.stdout)["plan"]  # the record is the executed plan
    put = next(s for s in dep["plan"] if s["action"] == "upload")
    head = boto3.client("s3", region_name=REGION, endpoint_url=aws_env).head_object(Bucket=BUCKET, Key=put["params"]["Key"])
    assert head["Metadata"]["sha256"] == put["params"]["Metadata"]["sha256"] == sha256_file(tmp_path / "w" / dep["id"] / "model.tar.gz")
    bad = subprocess.run([*args[:5], "--bucket", "Not_A_Bucket", "--pool", "g5:1", "--compute", "gpu"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--bucket" in bad.stderr and "--pool" in bad.stderr


def test_standalone_cli_writes_its_audit_file_and_destroys_what_it_recorded(aws_env, tiny_gguf, tmp_path):
    """`python -m deploy` without the workbench: the plan as executed, the outcome and the destroy go
    to a JSON-lines audit file, and destroy finds the recorded names there."""
    import subprocess
    import sys

    log = tmp_path / "audit.jsonl"
    common = ["--endpoint-url", aws_env, "--poll", "0.01", "--audit-log", str(log)]
    done = subprocess.run([sys.executable, "-m", "deploy", "apply", "--serving", "textgen", "--bucket", BUCKET,
                           "--suffix", "alone1", "--instance-type", "ml.c5.xlarge", "--model", str(tiny_gguf),
                           "--work-dir", str(tmp_path / "w"), "--role-arn", ROLE, *common], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["action"], e["status"]) for e in entries] == [("plan", "ok"), ("apply", "InService")]
    assert entries[0]["plan"] == json.loads(done.stdout)["plan"] and entries[0]["model_name"] == "textgen-cpu-alone1-model"
    gone = subprocess.run([sys.executable, "-m", "deploy", "destroy", "textgen-cpu-alone1", *common], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert gone.returncode == 0, gone.stderr
    assert json.loads(log.read_text().splitlines()[-1])["status"] == "deleted"
    sm = boto3.client("sagemaker", region_name=REGION, endpoint_url=aws_env)
    assert not [m for m in sm.list_models()["Models"] if "alone1" in m["ModelName"]]
    assert not [e for e in sm.list_endpoints()["Endpoints"] if "alone1" in e["EndpointName"]]


def test_a_confirm_that_fails_before_any_call_is_recorded(tmp_path, tiny_gguf):
    """No credentials or no AWS at all: the attempt still lands in the workbench's records (the Deploy
    page promises failed attempts are listed), with the reason."""
    from app.core.deploy_records import apply_and_record
    from app.core.store import Store

    store = Store(tmp_path / "wb.db")
    c = cfg(serving="semif", model_path=str(tiny_gguf))
    pkg = build_package(c, tmp_path / "work", gguf=tiny_gguf)
    steps = deployment_plan(c, pkg)
    unreachable = Executor(REGION, endpoint_url="http://127.0.0.1:9", poll_seconds=0.01)
    with pytest.raises(DeployError):
        apply_and_record(store, c, unreachable, steps=steps, pkg=pkg)
    (dep,) = store.list_deployments()
    assert dep["id"] == c.deployment_id and dep["status"] == "failed"
    audit = store.audit_log(dep["id"])
    assert [a["action"] for a in audit] == ["plan", "apply"] and audit[-1]["result"] == "failed" and audit[-1]["what"]


def test_apply_without_a_bucket_or_role_is_refused_and_calls_nothing(aws_env, tiny_gguf, tmp_path):
    """No made-up defaults: `apply` without --role-arn (or SEMIF_SAGEMAKER_ROLE_ARN) and the rest stops
    before packaging, naming the flag and the variable; no AWS call, nothing recorded."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items()
           if k not in ("SEMIF_DEPLOY_BUCKET", "SEMIF_SAGEMAKER_ROLE_ARN", "SEMIF_CODEBUILD_ROLE_ARN")}
    log, db, work = tmp_path / "audit.jsonl", tmp_path / "wb.db", tmp_path / "w"
    shape = ["--serving", "semif", "--suffix", "norole1", "--instance-type", "ml.c5.xlarge", "--model", str(tiny_gguf),
             "--work-dir", str(work), "--endpoint-url", aws_env, "--poll", "0.01"]
    for cli, ledger in ((["deploy"], ["--audit-log", str(log)]), (["app", "deploy"], ["--db", str(db)])):
        done = subprocess.run([sys.executable, "-m", *cli, "apply", *shape, *ledger], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and done.stdout == "", done.stderr
        assert "--role-arn: SageMaker execution role ARN is required: give --role-arn or set SEMIF_SAGEMAKER_ROLE_ARN" \
            in done.stderr
        assert "--bucket: S3 bucket is required: give --bucket or set SEMIF_DEPLOY_BUCKET" in done.stderr
        assert "give --codebuild-role-arn or set SEMIF_CODEBUILD_ROLE_ARN" in done.stderr
    # the variables count as the flags; a bad value from one is named with it
    done = subprocess.run([sys.executable, "-m", "deploy", "apply", *shape, "--audit-log", str(log)], cwd=ROOT,
                          env={**env, "SEMIF_DEPLOY_BUCKET": BUCKET, "SEMIF_SAGEMAKER_ROLE_ARN": "sm-role",
                               "SEMIF_CODEBUILD_ROLE_ARN": "arn:aws:iam::123456789012:role/cb"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--bucket" not in done.stderr and "--codebuild-role-arn" not in done.stderr
    assert "'sm-role' is not valid" in done.stderr and "from SEMIF_SAGEMAKER_ROLE_ARN" in done.stderr
    assert not log.exists() and not db.exists() and not work.exists()  # nothing packaged, nothing recorded
    sm = boto3.client("sagemaker", region_name=REGION, endpoint_url=aws_env)
    assert not [m for m in sm.list_models()["Models"] if "norole1" in m["ModelName"]]
    listed = boto3.client("s3", region_name=REGION, endpoint_url=aws_env).list_objects_v2(Bucket=BUCKET)
    assert not [o for o in listed.get("Contents", []) if "norole1" in o["Key"]]


def test_a_plan_without_bucket_or_roles_shows_placeholders_that_apply_refuses(tiny_gguf, tmp_path):
    import os
    import subprocess
    import sys

    from deploy.config import BUCKET_PLACEHOLDER, CODEBUILD_ROLE_PLACEHOLDER, ROLE_PLACEHOLDER

    env = {k: v for k, v in os.environ.items()
           if k not in ("SEMIF_DEPLOY_BUCKET", "SEMIF_SAGEMAKER_ROLE_ARN", "SEMIF_CODEBUILD_ROLE_ARN")}
    out = subprocess.run([sys.executable, "-m", "deploy", "plan", "--serving", "semif", "--suffix", "ph1", "--model",
                          str(tiny_gguf), "--work-dir", str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    params = {c["call"]: c["params"] for c in plan["calls"]}
    assert params["sagemaker.CreateModel"]["ExecutionRoleArn"] == ROLE_PLACEHOLDER
    assert params["codebuild.CreateProject"]["serviceRole"] == CODEBUILD_ROLE_PLACEHOLDER
    assert params["s3.PutObject"]["Bucket"] == BUCKET_PLACEHOLDER
    assert [u.split(":")[0] for u in plan["unfilled"]] == sorted([BUCKET_PLACEHOLDER, CODEBUILD_ROLE_PLACEHOLDER,
                                                                  ROLE_PLACEHOLDER])
    assert "--role-arn or SEMIF_SAGEMAKER_ROLE_ARN" in out.stderr
    # the same plan handed to the executor is refused before any call (here: no AWS at all)
    c = config_from_form({"region": REGION, "serving": "textgen", "suffix": "ph2", "account_id": "123456789012"},
                         placeholders=True)
    assert (c.bucket, c.role_arn) == (BUCKET_PLACEHOLDER, ROLE_PLACEHOLDER)
    steps = deployment_plan(c, build_package(c, tmp_path / "w", gguf=tiny_gguf))
    assert validate_plan(steps, REGION, allow_form_placeholders=True) == []
    unreachable = Executor(REGION, endpoint_url="http://127.0.0.1:9", poll_seconds=0.01)
    with pytest.raises(DeployError, match=r"unfilled <deploy-bucket>.*--bucket or SEMIF_DEPLOY_BUCKET"):
        unreachable.apply(c, steps)
    with pytest.raises(FormErrors) as err:
        config_from_form({"region": REGION, "serving": "textgen"})  # the Deploy page: no placeholders, required
    assert set(err.value.errors) == {"bucket", "role_arn"}
