"""Runs a plan with boto3: idempotent (an existing resource is reused and reported, never
duplicated), with progress events and plain-language errors for the usual failures."""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError, NoCredentialsError, WaiterError

from .config import DeployConfig
from .package import make_build_context, make_model_tarball, upload
from .plan import Package, Step, default_package, deployment_plan, teardown_plan

Event = Callable[[dict], None]
BUILD_DONE = {"SUCCEEDED", "FAILED", "FAULT", "STOPPED", "TIMED_OUT"}
SAGEMAKER_CREATES = {  # operation -> (name parameter, describe call, create call, result when created)
    "CreateModel": ("ModelName", "describe_model", "create_model", "created"),
    "CreateEndpointConfig": ("EndpointConfigName", "describe_endpoint_config", "create_endpoint_config", "created"),
    "CreateEndpoint": ("EndpointName", "describe_endpoint", "create_endpoint", "creating"),
}


class DeployError(RuntimeError):
    """A failure explained for a person: what failed and what to do."""


def friendly(exc: BaseException, what: str = "") -> str:
    prefix = f"{what}: " if what else ""
    if isinstance(exc, NoCredentialsError):
        return (prefix + "no AWS credentials found. Set AWS_PROFILE (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), "
                "or run `aws configure` / `aws sso login`.")
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        code, msg = err.get("Code", ""), err.get("Message", "")
        if code in ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "UnrecognizedClientException",
                    "InvalidClientTokenId", "ExpiredToken", "ExpiredTokenException"):
            return prefix + f"AWS refused ({code}): {msg}. Check the identity's IAM permissions and that its session is valid."
        if code in ("ResourceLimitExceeded", "ServiceQuotaExceededException", "LimitExceededException"):
            return prefix + f"quota exceeded ({code}): {msg}. Request an increase in Service Quotas for this instance type, or pick another."
        if "capacity" in (code + msg).lower():
            return prefix + f"not enough capacity ({code}): {msg}. A GPU pool with several instance types, or another region, helps."
        return prefix + f"{code}: {msg}"
    return prefix + f"{type(exc).__name__}: {exc}"


class Executor:
    def __init__(self, region: str, *, endpoint_url: str | None = None, session: boto3.session.Session | None = None,
                 poll_seconds: float = 15, on_event: Event | None = None, work_dir: Path | None = None):
        self.region = region
        self.endpoint_url = endpoint_url or os.environ.get("SEMIF_AWS_ENDPOINT_URL") or None
        self.session = session or boto3.session.Session(region_name=region)
        self.poll = poll_seconds
        self.on_event = on_event or (lambda e: None)
        self.work_dir = work_dir or Path(tempfile.gettempdir()) / "semif-deploy"
        self._clients: dict[str, Any] = {}

    def client(self, service: str):
        if service not in self._clients:
            self._clients[service] = self.session.client(
                service, region_name=self.region, endpoint_url=self.endpoint_url,
                config=Config(retries={"max_attempts": 5, "mode": "standard"}))
        return self._clients[service]

    def emit(self, **event) -> None:
        self.on_event(event)

    def account_id(self) -> str:
        try:
            return self.client("sts").get_caller_identity()["Account"]
        except (ClientError, NoCredentialsError) as exc:
            raise DeployError(friendly(exc, "who am I (STS)")) from None

    # -- packaging ---------------------------------------------------------------------------------
    def package(self, cfg: DeployConfig) -> Package:
        from adapter.models import resolve_model

        gguf = Path(cfg.model_path) if cfg.model_path else resolve_model().path
        pkg = default_package(cfg)
        self.emit(phase="package", message=f"packaging {gguf.name}" + (" + policy" if cfg.policy_path else ""))
        path, pkg.sha256 = make_model_tarball(gguf, self.work_dir / cfg.deployment_id / "model.tar.gz",
                                              Path(cfg.policy_path) if cfg.policy_path else None)
        self._files = {"model": path}
        if cfg.path == "semif" and not cfg.image_uri:
            src, pkg.source_sha256 = make_build_context(self.work_dir / cfg.deployment_id / "src.zip")
            self._files["source"] = src
        return pkg

    # -- apply -------------------------------------------------------------------------------------
    def apply(self, cfg: DeployConfig, steps: list[Step] | None = None, pkg: Package | None = None) -> dict:
        if cfg.account_id.startswith("<"):
            cfg.account_id = self.account_id()
        pkg = pkg or self.package(cfg)
        steps = steps or deployment_plan(cfg, pkg)
        outcome: dict[str, Any] = {"deployment_id": cfg.deployment_id, "endpoint_name": cfg.endpoint_name,
                                   "model_sha256": pkg.sha256, "steps": []}
        state: dict[str, Any] = {}
        for i, step in enumerate(steps, 1):
            self.emit(phase="step", index=i, total=len(steps), message=step.description, operation=step.operation)
            try:
                result = self._run(step, state, cfg, pkg)
            except (ClientError, NoCredentialsError) as exc:
                self.emit(phase="error", index=i, total=len(steps), message=friendly(exc, step.operation))
                raise DeployError(friendly(exc, f"step {i} {step.service}.{step.operation}")) from None
            outcome["steps"].append({"operation": step.operation, "result": result})
            self.emit(phase="done", index=i, total=len(steps), message=f"{step.operation}: {result}")
        outcome["status"] = self.status(cfg.endpoint_name)
        return outcome

    def _exists(self, fn, **kw) -> bool:
        try:
            fn(**kw)
            return True
        except ClientError as exc:
            if exc.response["Error"]["Code"] in ("ValidationException", "ResourceNotFound", "ResourceNotFoundException",
                                                 "RepositoryNotFoundException", "ImageNotFoundException"):
                return False
            raise

    def _run(self, step: Step, state: dict, cfg: DeployConfig, pkg: Package) -> str:
        sm = self.client("sagemaker")
        op = step.operation
        if step.kind == "upload":
            path = self._files[step.extra["what"]]
            sha = pkg.sha256 if step.extra["what"] == "model" else pkg.source_sha256
            return upload(self.client("s3"), path, step.params["Bucket"], step.params["Key"], sha,
                          lambda sent, total: self.emit(phase="upload", sent=sent, total=total,
                                                        message=f"{step.params['Key']}: {sent / max(total, 1):.0%}"))
        if op == "CreateRepository":
            return _create_or_reuse(self.client("ecr").create_repository, step.params, "RepositoryAlreadyExistsException")
        if op == "CreateProject":
            return _create_or_reuse(self.client("codebuild").create_project, step.params, "ResourceAlreadyExistsException")
        if op == "StartBuild":
            tag = step.extra["image_tag"]
            if self._exists(self.client("ecr").describe_images, repositoryName=cfg.repository,
                            imageIds=[{"imageTag": tag}]):
                state["build_id"] = None
                return f"skipped (image {tag} already in ECR)"
            state["build_id"] = self.client("codebuild").start_build(**step.params)["build"]["id"]
            return f"started build {state['build_id']}"
        if step.kind == "wait-build":
            if not state.get("build_id"):
                return "nothing to wait for"
            while True:
                build = self.client("codebuild").batch_get_builds(ids=[state["build_id"]])["builds"][0]
                self.emit(phase="wait", message=f"build {build.get('currentPhase')}: {build.get('buildStatus')}")
                if build["buildStatus"] in BUILD_DONE:
                    break
                time.sleep(self.poll)
            if build["buildStatus"] != "SUCCEEDED":
                failed = [p for p in build.get("phases", []) if p.get("phaseStatus") not in (None, "SUCCEEDED")]
                why = "; ".join(f"{p['phaseType']}: {(p.get('contexts') or [{}])[0].get('message', p.get('phaseStatus'))}"
                                for p in failed) or build["buildStatus"]
                raise DeployError(f"the image build {build['buildStatus']}: {why} (see the CodeBuild logs)")
            return "image built and pushed"
        if op in SAGEMAKER_CREATES:  # describe first: an existing resource is reused, never duplicated
            name_key, describe, create, created = SAGEMAKER_CREATES[op]
            if self._exists(getattr(sm, describe), **{name_key: step.params[name_key]}):
                return "reused (already exists)"
            getattr(sm, create)(**step.params)
            return created
        if step.kind == "wait-endpoint":
            return self._wait_endpoint(step.params["EndpointName"])
        if step.kind == "wait-deleted":
            try:
                sm.get_waiter("endpoint_deleted").wait(EndpointName=step.params["EndpointName"],
                                                       WaiterConfig={"Delay": self.poll, "MaxAttempts": 240})
            except WaiterError as exc:
                raise DeployError(f"the endpoint did not go away: {exc}") from None
            return "deleted"
        if op in ("DeleteEndpoint", "DeleteEndpointConfig", "DeleteModel"):
            try:
                getattr(sm, _snake(op))(**step.params)
                return "deleted"
            except ClientError as exc:
                if exc.response["Error"]["Code"] in ("ValidationException", "ResourceNotFound"):
                    return "already gone"
                raise
        raise DeployError(f"the executor does not know step {step.service}.{op}")

    def _wait_endpoint(self, name: str) -> str:
        sm = self.client("sagemaker")
        start = time.time()
        while True:
            ep = sm.describe_endpoint(EndpointName=name)
            status = ep["EndpointStatus"]
            self.emit(phase="wait", message=f"endpoint {status} after {time.time() - start:.0f} s")
            if status == "InService":
                return "InService"
            if status == "Failed":
                raise DeployError(f"the endpoint failed: {ep.get('FailureReason', 'no reason given')}")
            time.sleep(self.poll)

    # -- status / invoke / destroy ---------------------------------------------------------------------
    def status(self, endpoint: str) -> dict:
        try:
            ep = self.client("sagemaker").describe_endpoint(EndpointName=endpoint)
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ValidationException":
                return {"endpoint": endpoint, "status": "NotFound"}
            raise DeployError(friendly(exc, "describe_endpoint")) from None
        return summarize_endpoint(ep)

    def invoke(self, endpoint: str, body: bytes, content_type: str = "application/json", runtime_url: str | None = None) -> bytes:
        rt = self.session.client("sagemaker-runtime", region_name=self.region,
                                 endpoint_url=runtime_url or self.endpoint_url)
        try:
            return rt.invoke_endpoint(EndpointName=endpoint, ContentType=content_type, Accept="application/json",
                                      Body=body)["Body"].read()
        except (ClientError, NoCredentialsError) as exc:
            raise DeployError(friendly(exc, "invoke_endpoint")) from None

    def destroy(self, endpoint: str, endpoint_config: str, model: str) -> list[dict]:
        done = []
        steps = teardown_plan(endpoint, endpoint_config, model)
        for i, step in enumerate(steps, 1):
            self.emit(phase="step", index=i, total=len(steps), message=step.description, operation=step.operation)
            try:
                result = self._run(step, {}, None, None)  # type: ignore[arg-type]
            except (ClientError, NoCredentialsError) as exc:
                raise DeployError(friendly(exc, step.operation)) from None
            done.append({"operation": step.operation, "result": result})
            self.emit(phase="done", index=i, total=len(steps), message=f"{step.operation}: {result}")
        return done


def _create_or_reuse(create, params: dict, exists_code: str) -> str:
    try:
        create(**params)
        return "created"
    except ClientError as exc:
        if exc.response["Error"]["Code"] == exists_code:
            return "reused (already exists)"
        raise


def summarize_endpoint(ep: dict) -> dict:
    """Status, failure reason, and which instance pool won (the pool with running instances)."""
    variants = []
    for v in ep.get("ProductionVariants", []):
        pools = v.get("InstancePools") or []
        won = [p["InstanceType"] for p in pools if p.get("CurrentInstanceCount")]
        variants.append({"variant": v.get("VariantName"), "instances": v.get("CurrentInstanceCount"),
                         "pool_winner": won[0] if won else None, "pools": pools})
    return {"endpoint": ep.get("EndpointName"), "status": ep.get("EndpointStatus"),
            "failure_reason": ep.get("FailureReason"), "variants": variants}


def _snake(op: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in op).lstrip("_")
