"""Runs a plan with boto3, exactly as validated: idempotent (an existing resource is reused and
reported, never duplicated), one handler per step, every wait bounded, progress events, and
plain-language errors for the usual failures. Recording is the caller's, through `Recorder`."""
from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, NotRequired, Protocol, TypedDict

import boto3
from botocore.config import Config
from boto3.exceptions import Boto3Error
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, WaiterError

from .autoscaling import DIMENSION, resource_id
from .config import ACCOUNT_PLACEHOLDER, DeployConfig
from .package import build_package, sha256_file, upload
from .plan import Package, Step, bind_account, deployment_plan, placeholders, teardown_plan
from .errors import DeployError, friendly
from .settings import DeploySettings
from .transform import TransformJob, TransformSite, collect_results, transform_plan
from .validate import validate_plan

Event = Callable[[dict[str, Any]], None]
Check = Callable[[], tuple[bool, str]]  # (finished, what to show); raises DeployError on a failure
BUILD_DONE = {"SUCCEEDED", "FAILED", "FAULT", "STOPPED", "TIMED_OUT"}
NOT_FOUND = {"ValidationException", "ResourceNotFound", "ResourceNotFoundException", "ObjectNotFoundException",
             "RepositoryNotFoundException", "ImageNotFoundException", "NoSuchKey", "404"}
SAGEMAKER_CREATES = {  # operation -> (name parameter, describe call, result when created)
    "CreateModel": ("ModelName", "describe_model", "created"),
    "CreateEndpointConfig": ("EndpointConfigName", "describe_endpoint_config", "created"),
    "CreateEndpoint": ("EndpointName", "describe_endpoint", "creating"),
    "CreateTransformJob": ("TransformJobName", "describe_transform_job", "started"),
}



class StepDone(TypedDict):
    """A step that ran (run_steps): its operation and what its handler reported."""
    operation: str
    result: str


class EndpointStatus(TypedDict):
    """An endpoint as status() reads it (summarize_endpoint); only the name and "NotFound" when there is none."""
    endpoint: str | None
    status: str | None  # SageMaker's EndpointStatus (InService, Creating, Failed ...) or NotFound
    failure_reason: NotRequired[str | None]
    variants: NotRequired[list[dict[str, Any]]]  # per variant: instances and which pool won (AWS's own fields)


class ApplyOutcome(TypedDict):
    """What apply() did: the plan as run (each step's JSON), the steps' results and the endpoint's status."""
    deployment_id: str
    endpoint_name: str
    model_sha256: str | None
    image: str
    plan: list[dict[str, Any]]  # Step.to_dict() per step: the plan's JSON as recorded
    steps: list[StepDone]
    status: EndpointStatus


class Recorder(Protocol):
    """Where a deployment's life is written down. deploy/ never imports the workbench: the app's
    store implements this (app/core/deploy_records.py: StoreRecorder) and is handed in."""

    def planned(self, cfg: DeployConfig, steps: list[Step]) -> None:
        """The plan about to run: validated, account filled in, before the first call."""

    def finished(self, deployment_id: str, action: str, status: str, detail: str) -> None:
        """action 'apply' or 'destroy'; status InService/failed/deleted/destroy-failed; detail JSON or text."""


@dataclass
class Timeouts:
    """Seconds each kind of wait may take before a DeployError (every wait is bounded)."""
    build: float = 3600
    endpoint: float = 3600
    deleted: float = 1800
    transform: float = 6 * 3600


@dataclass
class RunState:
    """What one step hands to later steps of the same run."""
    build_id: str | None = None
    outputs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # transform output key -> lines


# every failure boto3 raises on a call: a refusal (ClientError), no credentials or no connection
# (BotoCoreError), a managed transfer that failed (S3UploadFailedError, a Boto3Error)
AWS_ERRORS = (ClientError, BotoCoreError, Boto3Error)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _snake(op: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in op).lstrip("_")


class Executor:
    def __init__(self, region: str, *, endpoint_url: str | None = None, session: boto3.session.Session | None = None,
                 poll_seconds: float = 15, on_event: Event | None = None, work_dir: Path | None = None,
                 timeouts: Timeouts | None = None, recorder: Recorder | None = None):
        self.region = region
        self.endpoint_url = endpoint_url or DeploySettings.from_env().aws_endpoint_url
        self.session = session or boto3.session.Session(region_name=region)
        self.poll = poll_seconds
        self.on_event: Event = on_event or (lambda e: None)
        self.work_dir = work_dir or Path(tempfile.gettempdir()) / "semif-deploy"
        self.timeouts = timeouts or Timeouts()
        self.recorder = recorder
        self._clients: dict[str, Any] = {}
        # one handler per step: keyed by the operation for plain calls, by the action otherwise
        self.handlers: dict[str, Callable[[Step, RunState], str]] = {
            "upload": self._upload, "wait-build": self._wait_build, "wait-endpoint": self._wait_endpoint,
            "wait-deleted": self._wait_deleted, "wait-transform": self._wait_transform, "read-output": self._read_output,
            "CreateRepository": partial(self._create_or_reuse, "RepositoryAlreadyExistsException"),
            "CreateProject": partial(self._create_or_reuse, "ResourceAlreadyExistsException"),
            "StartBuild": self._start_build,
            "RegisterScalableTarget": self._call, "PutScalingPolicy": self._call,  # both are upserts
            **{op: self._describe_or_create for op in SAGEMAKER_CREATES},
            **{op: self._delete for op in ("DeleteEndpoint", "DeleteEndpointConfig", "DeleteModel",
                                           "DeleteScalingPolicy", "DeregisterScalableTarget")},
        }

    def client(self, service: str) -> Any:
        if service not in self._clients:
            self._clients[service] = self.session.client(
                service, region_name=self.region, endpoint_url=self.endpoint_url,
                config=Config(retries={"max_attempts": 5, "mode": "standard"}))
        return self._clients[service]

    def emit(self, **event: Any) -> None:
        self.on_event(event)

    def account_id(self) -> str:
        try:
            return str(self.client("sts").get_caller_identity()["Account"])
        except AWS_ERRORS as exc:
            raise DeployError(friendly(exc, "who am I (STS)")) from None

    def package(self, cfg: DeployConfig) -> Package:
        """Local and deterministic: run it before planning, so the plan shows the real checksums."""
        self.emit(phase="package", message=f"packaging {cfg.model_path or 'the shipped model'}"
                                           + (" + policy" if cfg.policy_path else ""))
        return build_package(cfg, self.work_dir)

    # -- running steps -------------------------------------------------------------------------------
    def checked(self, steps: list[Step], region: str) -> list[Step]:
        """Refuse a plan that fails validation: nothing is called."""
        errors = validate_plan(steps, region)
        if errors:
            raise DeployError("the plan is invalid, nothing was called:\n  " + "\n  ".join(errors))
        return steps

    def run_steps(self, steps: list[Step], state: RunState | None = None) -> list[StepDone]:
        """Each step through its handler, in order; [{operation, result}] per step."""
        state = state or RunState()
        done: list[StepDone] = []
        for i, step in enumerate(steps, 1):
            self.emit(phase="step", index=i, total=len(steps), message=step.description, operation=step.operation)
            handler = self.handlers.get(step.operation if step.action == "call" else step.action)
            if handler is None:
                raise DeployError(f"the executor does not know step {step.service}.{step.operation} ({step.action})")
            try:
                result = handler(step, state)
            except AWS_ERRORS as exc:
                self.emit(phase="error", index=i, total=len(steps), message=friendly(exc, step.operation))
                raise DeployError(friendly(exc, f"step {i} {step.service}.{step.operation}")) from None
            done.append({"operation": step.operation, "result": result})
            self.emit(phase="done", index=i, total=len(steps), message=f"{step.operation}: {result}")
        return done

    def _wait_until(self, check: Check, timeout: float, what: str) -> str:
        """Poll check() every poll_seconds until it reports finished; DeployError after timeout s."""
        start = time.monotonic()
        while True:
            finished, message = check()
            elapsed = time.monotonic() - start
            self.emit(phase="wait", message=f"{what}: {message} after {elapsed:.0f} s")
            if finished:
                return message
            if elapsed >= timeout:
                raise DeployError(f"{what} did not finish within {timeout:g} s (last seen: {message}). "
                                  "Look at it in the AWS console; raise the timeout to wait longer.")
            time.sleep(max(0.0, min(self.poll, timeout - elapsed)))

    def _waiter_check(self, service: str, waiter: str, params: dict[str, Any], status_key: str,
                      failed: Callable[[dict[str, Any]], str]) -> Check:
        """One attempt of a boto3 waiter per poll, so _wait_until can report progress between them."""
        w = self.client(service).get_waiter(waiter)

        def check() -> tuple[bool, str]:
            try:
                w.wait(**params, WaiterConfig={"Delay": 1, "MaxAttempts": 1})
                return True, "done"
            except WaiterError as exc:
                last = exc.last_response or {}
                if "Max attempts exceeded" in str(exc):
                    return False, str(last.get(status_key, "pending"))
                err = last.get("Error")  # an error no acceptor expected (denied, throttled...) is not a failure state
                raise DeployError(f"{waiter}: {err.get('Code')}: {err.get('Message')}" if err else failed(last)) from None

        return check

    # -- handlers ------------------------------------------------------------------------------------
    def _call(self, step: Step, state: RunState) -> str:
        getattr(self.client(step.service), _snake(step.operation))(**step.params)
        return "done"

    def _upload(self, step: Step, state: RunState) -> str:
        p = step.params
        path, sha = Path(step.extra["file"]), p["Metadata"]["sha256"]
        if not path.is_file() or sha256_file(path) != sha:  # the file confirmed is the file sent
            raise DeployError(f"{path} is missing or changed since the plan was made (sha256 {sha[:12]}…): plan again")
        return upload(self.client("s3"), path, p["Bucket"], p["Key"], sha,
                      lambda sent, total: self.emit(phase="upload", sent=sent, total=total,
                                                    message=f"{p['Key']}: {sent / max(total, 1):.0%}"))

    def _create_or_reuse(self, exists_code: str, step: Step, state: RunState) -> str:
        try:
            self._call(step, state)
            return "created"
        except ClientError as exc:
            if _code(exc) == exists_code:
                return "reused (already exists)"
            raise

    def _exists(self, fn: Callable[..., Any], **kw: Any) -> bool:
        try:
            fn(**kw)
            return True
        except ClientError as exc:
            if _code(exc) in NOT_FOUND:
                return False
            raise

    def _describe_or_create(self, step: Step, state: RunState) -> str:
        """Describe first: an existing resource is reused, never duplicated."""
        name_key, describe, created = SAGEMAKER_CREATES[step.operation]
        sm = self.client("sagemaker")
        if self._exists(getattr(sm, describe), **{name_key: step.params[name_key]}):
            return "reused (already exists)"
        self._call(step, state)
        return created

    def _start_build(self, step: Step, state: RunState) -> str:
        tag = step.extra["image_tag"]
        if self._exists(self.client("ecr").describe_images, repositoryName=step.extra["repository"],
                        imageIds=[{"imageTag": tag}]):
            state.build_id = None
            return f"skipped (image {tag} already in ECR)"
        state.build_id = self.client("codebuild").start_build(**step.params)["build"]["id"]
        return f"started build {state.build_id}"

    def _wait_build(self, step: Step, state: RunState) -> str:
        build_id = state.build_id
        if not build_id:
            return "nothing to wait for"
        last: dict[str, Any] = {}

        def check() -> tuple[bool, str]:
            last.update(self.client("codebuild").batch_get_builds(ids=[build_id])["builds"][0])
            return last["buildStatus"] in BUILD_DONE, f"{last.get('currentPhase')}: {last.get('buildStatus')}"

        self._wait_until(check, self.timeouts.build, "image build")
        if last["buildStatus"] != "SUCCEEDED":
            failed = [p for p in last.get("phases", []) if p.get("phaseStatus") not in (None, "SUCCEEDED")]
            why = "; ".join(f"{p['phaseType']}: {(p.get('contexts') or [{}])[0].get('message', p.get('phaseStatus'))}"
                            for p in failed) or last["buildStatus"]
            raise DeployError(f"the image build {last['buildStatus']}: {why} (see the CodeBuild logs)")
        return "image built and pushed"

    def _wait_endpoint(self, step: Step, state: RunState) -> str:
        check = self._waiter_check("sagemaker", "endpoint_in_service", step.params, "EndpointStatus",
                                   lambda r: f"the endpoint failed: {r.get('FailureReason') or r.get('Error') or 'no reason given'}")
        self._wait_until(check, self.timeouts.endpoint, f"endpoint {step.params['EndpointName']}")
        return "InService"

    def _wait_deleted(self, step: Step, state: RunState) -> str:
        check = self._waiter_check("sagemaker", "endpoint_deleted", step.params, "EndpointStatus",
                                   lambda r: f"the endpoint did not go away: {r.get('FailureReason') or r}")
        self._wait_until(check, self.timeouts.deleted, f"deleting {step.params['EndpointName']}")
        return "deleted"

    def _wait_transform(self, step: Step, state: RunState) -> str:
        name = step.params["TransformJobName"]
        waiter = self._waiter_check("sagemaker", "transform_job_completed_or_stopped", step.params,
                                    "TransformJobStatus",
                                    lambda r: f"transform job {name} failed: {r.get('FailureReason') or r.get('Error')}")
        bucket, prefix, parts = step.extra["output_bucket"], step.extra["output_prefix"], step.extra["parts"]

        def check() -> tuple[bool, str]:
            finished, status = waiter()
            if finished:
                return True, status
            listed = self.client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix)
            written = sum(1 for o in listed.get("Contents", []) if o["Key"].endswith(".out"))
            return False, f"{status}, {written}/{parts} output files"

        self._wait_until(check, self.timeouts.transform, f"transform job {name}")
        job = self.client("sagemaker").describe_transform_job(TransformJobName=name)
        if job["TransformJobStatus"] != "Completed":  # the waiter also stops on Stopped
            raise DeployError(f"transform job {name} is {job['TransformJobStatus']}: {job.get('FailureReason') or 'stopped'}")
        return "Completed"

    def _read_output(self, step: Step, state: RunState) -> str:
        body = self.client("s3").get_object(**step.params)["Body"].read().decode("utf-8")
        try:
            lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise DeployError(f"{step.params['Key']} is not JSON Lines: {exc}") from None
        state.outputs[step.params["Key"]] = lines
        return f"{len(lines)} results"

    def _delete(self, step: Step, state: RunState) -> str:
        try:
            self._call(step, state)
            return "deleted"
        except ClientError as exc:
            if _code(exc) in NOT_FOUND:
                return "already gone"
            raise

    # -- apply / status / invoke / destroy ------------------------------------------------------------
    def _filled(self, cfg: DeployConfig, steps: list[Step]) -> list[Step]:
        """The plan with the account id filled in (from STS when cfg does not know it yet)."""
        if ACCOUNT_PLACEHOLDER not in placeholders([s.params for s in steps]):
            return steps
        if cfg.account_id == ACCOUNT_PLACEHOLDER:
            cfg.account_id = self.account_id()
        return bind_account(steps, cfg.account_id)

    def apply(self, cfg: DeployConfig, steps: list[Step] | None = None, pkg: Package | None = None, *,
              recorder: Recorder | None = None) -> ApplyOutcome:
        """Run `steps` (the plan the person confirmed; default: package if no `pkg`, then plan) with
        `<account-id>` filled in from STS. The plan is validated again and refused when invalid; the
        recorder gets exactly the steps that then run."""
        recorder = recorder or self.recorder
        if steps is None:
            if cfg.builds_image and cfg.account_id == ACCOUNT_PLACEHOLDER:  # fail fast, before packaging
                cfg.account_id = self.account_id()
            steps = deployment_plan(cfg, pkg or self.package(cfg))
        try:  # no credentials, no STS, an invalid plan: the attempt is recorded as failed too
            steps = self.checked(self._filled(cfg, steps), cfg.region)
            if not any(s.operation == "CreateEndpoint" and s.params.get("EndpointName") == cfg.endpoint_name
                       for s in steps):
                raise DeployError(f"this plan does not create {cfg.endpoint_name}: plan again for this configuration")
        except DeployError as exc:
            if recorder:
                recorder.planned(cfg, steps)
                recorder.finished(cfg.deployment_id, "apply", "failed", str(exc))
            raise
        if recorder:
            recorder.planned(cfg, steps)
        try:
            done = self.run_steps(steps)
        except DeployError as exc:
            if recorder:
                recorder.finished(cfg.deployment_id, "apply", "failed", str(exc))
            raise
        uploads = {s.extra.get("what"): s.params["Metadata"]["sha256"] for s in steps if s.action == "upload"}
        image = next(s.params["PrimaryContainer"]["Image"] for s in steps if s.operation == "CreateModel")
        outcome: ApplyOutcome = {"deployment_id": cfg.deployment_id, "endpoint_name": cfg.endpoint_name,
                   "model_sha256": uploads.get("model"), "image": image,
                   "plan": [s.to_dict() for s in steps], "steps": done, "status": self.status(cfg.endpoint_name)}
        if recorder:
            recorder.finished(cfg.deployment_id, "apply", outcome["status"]["status"] or "unknown",
                              json.dumps({"model_sha256": outcome["model_sha256"], "image": image, "steps": done}))
        return outcome

    def run_transform(self, where: DeployConfig | TransformSite, job: TransformJob, steps: list[Step] | None = None,
                      pkg: Package | None = None) -> list[dict[str, Any]]:
        """Run a Batch Transform plan (default: transform_plan(where, job, pkg)) and return one result or
        error object per input row, in input order, each carrying its row's id. `where`: a TransformSite
        for a job that reuses a model (no role needed), the DeployConfig when the plan creates it."""
        steps = steps if steps is not None else transform_plan(where, job, pkg)
        if isinstance(where, DeployConfig):  # a plan that builds the image names the account: from STS if unknown
            steps = self._filled(where, steps)
        steps = self.checked(steps, where.region)
        state = RunState()
        self.run_steps(steps, state)
        return collect_results(job, steps, state.outputs)

    def status(self, endpoint: str) -> EndpointStatus:
        try:
            ep = self.client("sagemaker").describe_endpoint(EndpointName=endpoint)
        except ClientError as exc:
            if _code(exc) == "ValidationException":
                return {"endpoint": endpoint, "status": "NotFound"}
            raise DeployError(friendly(exc, "describe_endpoint")) from None
        return summarize_endpoint(ep)

    def invoke(self, endpoint: str, body: bytes, content_type: str = "application/json",
               runtime_url: str | None = None) -> bytes:
        rt = self.session.client("sagemaker-runtime", region_name=self.region,
                                 endpoint_url=runtime_url or self.endpoint_url)
        try:
            return bytes(rt.invoke_endpoint(EndpointName=endpoint, ContentType=content_type, Accept="application/json",
                                            Body=body)["Body"].read())
        except AWS_ERRORS as exc:
            raise DeployError(friendly(exc, "invoke_endpoint")) from None

    def is_autoscaled(self, endpoint: str) -> bool:
        """Whether Application Auto Scaling has the endpoint's variant registered."""
        try:
            found = self.client("application-autoscaling").describe_scalable_targets(
                ServiceNamespace="sagemaker", ResourceIds=[resource_id(endpoint)], ScalableDimension=DIMENSION)
        except AWS_ERRORS as exc:
            raise DeployError(friendly(exc, "describe_scalable_targets")) from None
        return bool(found.get("ScalableTargets"))

    def destroy(self, endpoint: str, endpoint_config: str, model: str, autoscaling: bool | None = None, *,
                recorder: Recorder | None = None) -> list[StepDone]:
        """Delete in reverse order; the scaling policy and target first when the variant has them
        (None: ask Application Auto Scaling)."""
        recorder = recorder or self.recorder
        try:
            if autoscaling is None:
                autoscaling = self.is_autoscaled(endpoint)
            done = self.run_steps(self.checked(teardown_plan(endpoint, endpoint_config, model, autoscaling), self.region))
        except DeployError as exc:
            if recorder:
                recorder.finished(endpoint, "destroy", "destroy-failed", str(exc))
            raise
        if recorder:
            recorder.finished(endpoint, "destroy", "deleted", json.dumps(done))
        return done


def summarize_endpoint(ep: dict[str, Any]) -> EndpointStatus:
    """Status, failure reason, and which instance pool won (the pool with running instances)."""
    variants = []
    for v in ep.get("ProductionVariants", []):
        pools = v.get("InstancePools") or []
        won = [p["InstanceType"] for p in pools if p.get("CurrentInstanceCount")]
        variants.append({"variant": v.get("VariantName"), "instances": v.get("CurrentInstanceCount"),
                         "pool_winner": won[0] if won else None, "pools": pools})
    return {"endpoint": ep.get("EndpointName"), "status": ep.get("EndpointStatus"),
            "failure_reason": ep.get("FailureReason"), "variants": variants}
