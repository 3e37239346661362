"""Deployments: plans checked offline, the full apply -> status -> invoke -> destroy against moto's
server on 127.0.0.1, and the real sagemaker-runtime client -> a local shim -> the adapter process."""
from __future__ import annotations

import json
import subprocess
import sys

import boto3
import pytest
import yaml

from deploy.config import DeployConfig
from deploy.executor import DeployError, Executor, friendly, summarize_endpoint
from deploy.package import build_package, make_build_context, make_model_tarball, sha256_file
from deploy.plan import Package, deployment_plan, teardown_plan
from deploy.validate import botocore_errors, validate_plan
from tests.conftest import ROOT
from tests.shim import RuntimeShim

REGION = "us-east-1"


def tarball_members(path) -> list[str]:
    import tarfile

    with tarfile.open(path, "r:gz") as tar:
        return tar.getnames()


def cfg(**kw) -> DeployConfig:
    base = dict(region=REGION, bucket="semif-test-models", role_arn="arn:aws:iam::123456789012:role/sm",
                codebuild_role_arn="arn:aws:iam::123456789012:role/cb", account_id="123456789012",
                name_suffix="t1")
    return DeployConfig(**{**base, **kw})


def package(c: DeployConfig, tmp_path) -> Package:
    """A real package of a tiny stand-in GGUF: plans are made from finished packages."""
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 1000)
    return build_package(c, tmp_path / "work", gguf=gguf)


@pytest.mark.parametrize("path,compute", [("textgen", "cpu"), ("textgen", "gpu"), ("semif", "cpu"), ("semif", "gpu")])
def test_every_plan_validates_against_botocore(path, compute, tmp_path):
    c = cfg(serving=path, compute=compute)
    steps = deployment_plan(c, package(c, tmp_path))
    assert validate_plan(steps, REGION) == []
    ops = [s.operation for s in steps]
    assert ops[-3:] == ["CreateEndpointConfig", "CreateEndpoint", "DescribeEndpoint"]
    assert ("StartBuild" in ops) == (path == "semif")
    model = next(s for s in steps if s.operation == "CreateModel").params
    variant = next(s for s in steps if s.operation == "CreateEndpointConfig").params["ProductionVariants"][0]
    image = model["PrimaryContainer"]["Image"]
    env = model["PrimaryContainer"]["Environment"]
    if path == "textgen":
        assert image.endswith("llama-cpp:server-sagemaker-" + ("cuda" if compute == "gpu" else "cpu") + "-v1")
        assert env.get("SM_LLAMA_CPP_CTX_SIZE") == str(c.ctx_size)  # not empty: the check below reads something
        assert all(k.startswith("SM_LLAMA_CPP_") for k in env)
    else:
        assert image.startswith("123456789012.dkr.ecr.us-east-1.amazonaws.com/semif-adapter:src-")
        assert env.get("SM_SEMIF_CTX_SIZE") == str(c.ctx_size)  # not empty: the check below reads something
        assert all(k.startswith("SM_SEMIF_") for k in env)
    if compute == "gpu":
        assert [p["InstanceType"] for p in variant["InstancePools"]] == ["ml.g6e.xlarge", "ml.g6.xlarge", "ml.g5.xlarge",
                                                                         "ml.g4dn.xlarge"]
        assert [p["Priority"] for p in variant["InstancePools"]] == [1, 2, 3, 4]
        assert variant["InferenceAmiVersion"] == "al2023-ami-sagemaker-inference-gpu-4-1" and "InstanceType" not in variant
    else:
        assert variant["InstanceType"] == "ml.c7i.xlarge" and "InstancePools" not in variant
    tags = {t["Key"]: t["Value"] for t in model["Tags"]}
    assert tags["semif:deployment"] == c.deployment_id


def test_our_rules_reject_what_botocore_allows(tmp_path):
    c = cfg(compute="gpu", pools=[(f"ml.g5.{n}xlarge", i + 1) for i, n in enumerate(["", "2", "4", "8", "12", "16"])])
    pkg = package(c, tmp_path)  # the package does not depend on the pool or the timeouts
    errs = validate_plan(deployment_plan(c, pkg), REGION)
    assert any("6 entries" in e for e in errs)
    c = cfg(compute="gpu", pools=[("ml.g6.xlarge", 1), ("ml.g5.xlarge", 1)])
    assert any("must be unique" in e for e in validate_plan(deployment_plan(c, pkg), REGION))
    c = cfg(compute="gpu", provision_timeout=100, startup_timeout=5000)
    errs = validate_plan(deployment_plan(c, pkg), REGION)
    assert any("VariantInstanceProvisionTimeoutInSeconds=100" in e for e in errs)
    assert any("ContainerStartupHealthCheckTimeoutInSeconds=5000" in e for e in errs)
    c = cfg(extra_env={f"K{i}": "v" for i in range(120)})
    assert any("100" in e for e in validate_plan(deployment_plan(c, pkg), REGION))
    c = cfg(serving="textgen")
    pkg = package(c, tmp_path)
    steps = deployment_plan(c, pkg)
    steps[-4].params["PrimaryContainer"]["Image"] = "763104351884.dkr.ecr.eu-west-1.amazonaws.com/llama-cpp:x"
    assert any("another region" in e for e in validate_plan(steps, REGION))
    bad = deployment_plan(c, pkg)
    bad[-3].params["ProductionVariants"][0]["InitialInstanceCount"] = "one"
    assert any("InitialInstanceCount" in e for e in botocore_errors(bad[-3]))


def test_teardown_is_reverse_order_and_valid():
    steps = teardown_plan("ep", "ep-config", "ep-model")
    assert [s.operation for s in steps] == ["DeleteEndpoint", "DescribeEndpoint", "DeleteEndpointConfig", "DeleteModel"]
    assert validate_plan(steps, REGION) == []


def test_a_second_plan_reuses_the_packed_model_and_a_changed_one_is_packed_again(tmp_path):
    from deploy.package import cached_model_tarball

    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 5000)
    cache = tmp_path / "cache"
    a, sha_a = cached_model_tarball(gguf, tmp_path / "dep-a" / "model.tar.gz", None, cache)
    b, sha_b = cached_model_tarball(gguf, tmp_path / "dep-b" / "model.tar.gz", None, cache)
    assert sha_a == sha_b == sha256_file(b) and a.stat().st_ino == b.stat().st_ino  # linked, not packed twice
    assert sha_a == make_model_tarball(gguf, tmp_path / "fresh.tar.gz")[1]  # the same bytes as packing it anew
    (entry,) = cache.glob("*.tar.gz")
    entry.write_bytes(b"damaged")  # a cache entry that changed since its checksum was recorded
    c, sha_c = cached_model_tarball(gguf, tmp_path / "dep-c" / "model.tar.gz", None, cache)
    assert sha_c == sha_a == sha256_file(c)
    policy = tmp_path / "p.json"
    policy.write_text("{}")
    d, sha_d = cached_model_tarball(gguf, tmp_path / "dep-d" / "model.tar.gz", policy, cache)
    assert sha_d != sha_a and tarball_members(d) == ["tiny.gguf", "policy.json"]  # another policy, another file


def test_package_has_one_gguf_at_root_and_is_deterministic(tmp_path):
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 1000)
    policy = tmp_path / "p.json"
    policy.write_text("{}")
    a, sha_a = make_model_tarball(gguf, tmp_path / "a" / "model.tar.gz", policy)
    b, sha_b = make_model_tarball(gguf, tmp_path / "b" / "model.tar.gz", policy)
    assert sha_a == sha_b and tarball_members(a) == ["tiny.gguf", "policy.json"]
    # what SageMaker does with it before the container starts: a plain `tar -xzf` into /opt/ml/model
    unpacked = tmp_path / "opt-ml-model"
    unpacked.mkdir()
    subprocess.run(["tar", "-xzf", str(a), "-C", str(unpacked)], check=True)
    assert (unpacked / "tiny.gguf").read_bytes() == gguf.read_bytes() and (unpacked / "policy.json").read_text() == "{}"
    with pytest.raises(ValueError, match="not a .gguf"):
        make_model_tarball(policy, tmp_path / "c.tar.gz")
    src, sha = make_build_context(tmp_path / "src.zip")
    import zipfile

    names = zipfile.ZipFile(src).namelist()
    assert "Dockerfile" in names and "adapter/server/app.py" in names and "deploy/buildspec.yml" in names
    assert make_build_context(tmp_path / "src2.zip")[1] == sha


def test_buildspec_builds_from_the_base_image_arg_and_pushes():
    spec = yaml.safe_load((ROOT / "deploy" / "buildspec.yml").read_text())
    pre = " ".join(spec["phases"]["pre_build"]["commands"])
    build = " ".join(spec["phases"]["build"]["commands"])
    post = " ".join(spec["phases"]["post_build"]["commands"])
    assert "docker login" in pre and "get-login-password" in pre and "$DLC_REGISTRY" in pre
    assert 'docker build --build-arg BASE_IMAGE="$BASE_IMAGE"' in build and "$IMAGE_REPO_URI:$IMAGE_TAG" in build
    assert 'docker push "$IMAGE_REPO_URI:$IMAGE_TAG"' in post


def test_friendly_errors_and_pool_winner():
    from botocore.exceptions import ClientError, NoCredentialsError

    assert "aws configure" in friendly(NoCredentialsError())
    quota = ClientError({"Error": {"Code": "ResourceLimitExceeded", "Message": "ml.g6e.xlarge for endpoint usage"}}, "X")
    assert "Service Quotas" in friendly(quota)
    denied = ClientError({"Error": {"Code": "AccessDeniedException", "Message": "no"}}, "X")
    assert "IAM permissions" in friendly(denied)
    cap = ClientError({"Error": {"Code": "InsufficientInstanceCapacity", "Message": "none"}}, "X")
    assert "capacity" in friendly(cap)
    ep = {"EndpointName": "e", "EndpointStatus": "InService", "ProductionVariants": [{
        "VariantName": "AllTraffic", "CurrentInstanceCount": 1,
        "InstancePools": [{"InstanceType": "ml.g6e.xlarge", "CurrentInstanceCount": 0},
                          {"InstanceType": "ml.g6.xlarge", "CurrentInstanceCount": 1}]}]}
    assert summarize_endpoint(ep)["variants"][0]["pool_winner"] == "ml.g6.xlarge"


# -- against moto's server ---------------------------------------------------------------------------
def test_full_gpu_semif_lifecycle_against_moto(aws_env, tmp_path):
    events = []
    ex = Executor(REGION, endpoint_url=aws_env, poll_seconds=0.01, on_event=events.append, work_dir=tmp_path)
    c = cfg(compute="gpu", account_id="<account-id>", name_suffix="life1", repository="semif-adapter-life",
            project="semif-adapter-build-life")  # its own repository/project: the moto server is shared
    out = ex.apply(c)
    assert c.account_id == "123456789012"  # resolved through STS
    results = {s["operation"]: s["result"] for s in out["steps"]}
    assert results["CreateRepository"] == "created" and results["StartBuild"].startswith("started build")
    assert results["BatchGetBuilds"] == "image built and pushed" and out["status"]["status"] == "InService"
    sm = boto3.client("sagemaker", region_name=REGION, endpoint_url=aws_env)
    model = sm.describe_model(ModelName=c.model_name)
    assert model["PrimaryContainer"]["Image"].startswith("123456789012.dkr.ecr.us-east-1.amazonaws.com/semif-adapter-life:src-")
    assert model["PrimaryContainer"]["ModelDataUrl"] == f"s3://semif-test-models/models/semif/{c.deployment_id}/model.tar.gz"
    s3 = boto3.client("s3", region_name=REGION, endpoint_url=aws_env)
    head = s3.head_object(Bucket="semif-test-models", Key=f"models/semif/{c.deployment_id}/model.tar.gz")
    assert head["Metadata"]["sha256"] == out["model_sha256"]
    assert any(e.get("phase") == "upload" for e in events)
    assert boto3.client("codebuild", region_name=REGION, endpoint_url=aws_env).batch_get_projects(
        names=["semif-adapter-build-life"])["projects"][0]["environment"]["privilegedMode"] is True

    again = ex.apply(c)  # idempotent: everything reused or skipped, nothing duplicated
    res2 = {s["operation"]: s["result"] for s in again["steps"]}
    assert res2["CreateModel"].startswith("reused") and res2["CreateEndpoint"].startswith("reused")
    assert res2["CreateRepository"].startswith("reused") and "skipped" in res2["PutObject"]
    assert len([e for e in sm.list_endpoints()["Endpoints"] if e["EndpointName"] == c.endpoint_name]) == 1

    assert ex.status(c.endpoint_name)["status"] == "InService"
    done = ex.destroy(c.endpoint_name, c.endpoint_config_name, c.model_name)
    assert [d["operation"] for d in done][0] == "DeleteEndpoint"
    assert ex.status(c.endpoint_name)["status"] == "NotFound"
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError):
        sm.describe_model(ModelName=c.model_name)
    with pytest.raises(ClientError):
        sm.describe_endpoint_config(EndpointConfigName=c.endpoint_config_name)


def test_cli_plan_apply_status_destroy_against_moto(aws_env, tmp_path):
    db = tmp_path / "wb.db"
    base = [sys.executable, "-m", "app", "deploy"]  # deploy's CLI, recording into the workbench store
    common = ["--endpoint-url", aws_env, "--poll", "0.01", "--db", str(db)]
    shape = ["--path", "textgen", "--compute", "cpu", "--bucket", "semif-test-models", "--suffix", "cli1",
             "--instance-type", "ml.c5.xlarge"]  # in moto's (stale) list of instance types
    env = {k: v for k, v in __import__("os").environ.items()}
    plan = subprocess.run([*base, "plan", *shape], cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert plan.returncode == 0 and json.loads(plan.stdout)["calls"][1]["call"] == "sagemaker.CreateModel"
    dry = subprocess.run([*base, "apply", "--dry-run", *shape, *common], cwd=ROOT, capture_output=True, text=True,
                         env=env, timeout=120)
    assert dry.returncode == 0 and not db.exists()  # nothing called, nothing recorded
    bad = subprocess.run([*base, "plan", *shape, "--compute", "gpu", "--pool", "ml.g5.xlarge:1", "--pool", "ml.g6.xlarge:1"],
                         cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "unique" in bad.stderr
    role = ["--role-arn", "arn:aws:iam::123456789012:role/sm"]  # apply has no made-up default for it
    applied = subprocess.run([*base, "apply", *shape, *common, *role], cwd=ROOT, capture_output=True, text=True,
                             env=env, timeout=300)
    assert applied.returncode == 0, applied.stderr
    name = "textgen-cpu-cli1"
    status = subprocess.run([*base, "status", name, *common], cwd=ROOT, capture_output=True, text=True, env=env)
    assert json.loads(status.stdout)["status"] == "InService"
    from app.core.store import Store

    store = Store(db)
    assert store.get_deployment(name)["status"] == "InService"
    assert any(t["name"] == name and t["config"]["protocol"] == "chat" for t in store.list_targets())
    gone = subprocess.run([*base, "destroy", name, *common], cwd=ROOT, capture_output=True, text=True, env=env)
    assert gone.returncode == 0, gone.stderr
    assert store.get_deployment(name)["status"] == "deleted"
    log = store.audit_log(name)
    assert [a["action"] for a in log] == ["plan", "apply", "destroy"]
    assert len(json.loads(log[1]["what"])["model_sha256"]) == 64  # the package checksum is on record
    assert not any(t["name"] == name for t in store.list_targets())


def test_no_credentials_is_a_clear_error(monkeypatch, moto_url, tmp_path):
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    ex = Executor(REGION, endpoint_url=moto_url, poll_seconds=0.01, work_dir=tmp_path)
    with pytest.raises(DeployError, match="no AWS credentials"):
        ex.apply(cfg(account_id="<account-id>"))


def test_boto3_runtime_through_shim_to_the_adapter(adapter_server, monkeypatch):
    from adapter.engine.templates import load_template, request_for
    from app.targets.remote import SageMakerTarget

    shim = RuntimeShim({"semif-gpu-live": adapter_server.url})
    try:
        rt = boto3.client("sagemaker-runtime", region_name=REGION, endpoint_url=shim.url,
                          aws_access_key_id="x", aws_secret_access_key="y")
        row = request_for(load_template("ticket-routing"), "Charged twice for one order", "r1").model_dump(exclude_none=True)
        resp = rt.invoke_endpoint(EndpointName="semif-gpu-live", ContentType="application/json", Body=json.dumps(row))
        out = json.loads(resp["Body"].read())
        assert out["id"] == "r1" and out["option_ids"] == ["access", "billing", "technical", "shipping"]
        direct = __import__("httpx").post(adapter_server.url + "/invocations", json=row, timeout=120).json()
        assert out["probabilities"] == direct["probabilities"]  # intact through boto3 and the shim
        monkeypatch.setenv("SEMIF_AWS_RUNTIME_URL", shim.url)  # where AWS calls go: the operator's setting
        target = SageMakerTarget("sm", {"endpoint_name": "semif-gpu-live", "region": REGION})
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")  # undone after the test: no fake credentials leak on
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
        res = target.decide(request_for(load_template("ticket-routing"), "Charged twice for one order", "r1"))
        assert res.ok and res.result.probabilities == direct["probabilities"]  # a typed DecisionResult now
        missing = SageMakerTarget("sm", {"endpoint_name": "nope", "region": REGION})
        res = missing.decide(request_for(load_template("ticket-routing"), "x", "r2"))
        assert not res.ok and "SageMaker" in res.error
    finally:
        shim.stop()
