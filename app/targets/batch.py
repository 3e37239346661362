"""SageMaker Batch Transform as a target for labeled-set evaluations (no Streamlit): the rows a
run still needs go out as one transform job (JSON Lines in S3, the SemIf model reused by name),
and each output line comes back as that row's result - or its error - like any target's.

It scores many rows at once, so it has `decide_batch` instead of a per-row `decide`; the
evaluation loop ingests the results row by row (a resumed run stores no row twice)."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from botocore.exceptions import BotoCoreError, ClientError

from adapter.schema import DecisionRequest, DecisionResult
from deploy.config import DEFAULT_TRANSFORM_INSTANCE
from deploy.errors import DeployError
from deploy.transform import prepare_transform, site_from_form

from app.settings import WorkbenchSettings
from app.targets.base import Config, Target, TargetError, TargetResult, decision_from
from app.targets.remote import aws_error

if TYPE_CHECKING:  # imported when a job runs (boto3's start-up cost)
    from deploy.executor import Executor

WORK = Path(tempfile.gettempdir()) / "semif-transform"


class BatchTransformTarget(Target):
    batch_only = True

    def __init__(self, name: str, config: Config):
        super().__init__(name, "sagemaker-batch", config)
        self.model_name = config["model_name"]
        self.bucket = config["bucket"]
        self.region = config.get("region") or WorkbenchSettings.from_env().region

    def _one(self, req: DecisionRequest) -> tuple[Any, Any, DecisionResult]:
        raise TargetError("a Batch Transform target scores labeled sets (Calibrate page, python -m app calibrate), "
                          "not single decisions: use the SageMaker endpoint target for those")

    def executor(self, on_event: Callable[[dict[str, Any]], None] | None = None) -> Executor:
        from deploy.executor import Executor  # lazy: deploy.executor imports boto3 (start-up cost)

        poll = WorkbenchSettings.from_env().deploy_poll
        return Executor(self.region, endpoint_url=WorkbenchSettings.from_env().aws_endpoint_url, poll_seconds=poll,
                        on_event=on_event)

    def decide_batch(self, requests: list[DecisionRequest], on_event: Callable[[dict[str, Any]], None] | None = None
                     ) -> list[TargetResult]:
        """One transform job for all `requests`; a result per request, in order. The latency of each
        is the job's wall time divided by its rows (Batch Transform has no per-row timing)."""
        bodies = [r.model_dump(exclude_none=True) for r in requests]
        t0 = time.perf_counter()
        try:  # the model exists with its role and image: the job needs only the region and the bucket
            site = site_from_form({"region": self.region, "bucket": self.bucket})
            job = prepare_transform(bodies, WORK, model_name=self.model_name, prefix=site.prefix,
                                    instance_type=self.config.get("instance_type") or DEFAULT_TRANSFORM_INSTANCE,
                                    instance_count=int(self.config.get("instance_count") or 1))
            lines = self.executor(on_event).run_transform(site, job)
        except (DeployError, ValueError) as exc:
            raise TargetError(f"Batch Transform: {exc}") from None
        each = (time.perf_counter() - t0) / max(1, len(requests))
        out = []
        for req, body, line in zip(requests, bodies, lines):
            if "error" in line:
                err = line["error"]
                detail = "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}"
                                   for d in err.get("detail", []) if isinstance(d, dict))
                out.append(TargetResult(req.id, each, None, f"HTTP {err.get('status')}: {detail}", body, line))
                continue
            try:
                out.append(TargetResult(req.id, each, decision_from(line, self.model_name), None, body, line))
            except TargetError as exc:
                out.append(TargetResult(req.id, each, None, str(exc), body, line))
        return out

    def test_connection(self) -> str:
        try:
            self.executor().client("sagemaker").describe_model(ModelName=self.model_name)
        except (ClientError, BotoCoreError) as exc:
            raise aws_error(exc) from None
        return f"model {self.model_name} exists in {self.region}; results go through s3://{self.bucket}"
