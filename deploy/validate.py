"""Offline checks of a plan: botocore's ParamValidator against the real service models, plus the
rules botocore does not enforce (pool maxima, timeouts, environment size, region consistency)."""
from __future__ import annotations

import json

import botocore.session
from botocore.validate import ParamValidator

from .config import NAME_RE
from .plan import Step

_session = botocore.session.get_session()
_PLACEHOLDER_OK = {"<build id>"}


def _shape(step: Step):
    model = _session.get_service_model(step.service)
    return model.operation_model(step.operation).input_shape


def botocore_errors(step: Step) -> list[str]:
    report = ParamValidator().validate(step.params, _shape(step))
    return [f"{step.service}.{step.operation}: {line.strip()}" for line in report.generate_report().splitlines()
            if line.strip() and not line.startswith("Parameter validation failed")] if report.has_errors() else []


def rule_errors(step: Step, region: str | None = None) -> list[str]:
    errs = []
    where = f"{step.service}.{step.operation}"
    p = step.params
    for key in ("ModelName", "EndpointConfigName", "EndpointName"):
        if key in p and not NAME_RE.match(p[key]):
            errs.append(f"{where}: {key} {p[key]!r} must be 1-63 letters, digits and hyphens")
    for variant in p.get("ProductionVariants", []):
        pools = variant.get("InstancePools")
        if pools is not None:
            if not 1 <= len(pools) <= 5:
                errs.append(f"{where}: InstancePools has {len(pools)} entries; SageMaker allows 1 to 5")
            prios = [x.get("Priority") for x in pools]
            if len(set(prios)) != len(prios):
                errs.append(f"{where}: InstancePools priorities {prios} must be unique")
            if any(not isinstance(x, int) or not 1 <= x <= 5 for x in prios):
                errs.append(f"{where}: InstancePools priorities {prios} must be integers 1..5")
            if "InstanceType" in variant:
                errs.append(f"{where}: give InstanceType or InstancePools, not both")
        elif "InstanceType" not in variant and "ServerlessConfig" not in variant:
            errs.append(f"{where}: a variant needs InstanceType or InstancePools")
        for key, lo, hi in (("VariantInstanceProvisionTimeoutInSeconds", 300, 3600),
                            ("ContainerStartupHealthCheckTimeoutInSeconds", 60, 3600),
                            ("ModelDataDownloadTimeoutInSeconds", 60, 3600)):
            if key in variant and not lo <= variant[key] <= hi:
                errs.append(f"{where}: {key}={variant[key]} is outside {lo}..{hi}")
    container = p.get("PrimaryContainer") or {}
    env = container.get("Environment") or {}
    if len(env) > 100:
        errs.append(f"{where}: Environment has {len(env)} keys; the limit is 100")
    if len(json.dumps(env)) > 32 * 1024:
        errs.append(f"{where}: Environment is {len(json.dumps(env))} bytes; the limit is 32 KB")
    image = container.get("Image", "")
    if region and ".dkr.ecr." in image and f".dkr.ecr.{region}." not in image:
        errs.append(f"{where}: image {image} is in another region than the endpoint ({region})")
    url = container.get("ModelDataUrl")
    if url and not url.startswith("s3://"):
        errs.append(f"{where}: ModelDataUrl must be an s3:// URL")
    return errs


def validate_plan(steps: list[Step], region: str | None = None) -> list[str]:
    """All problems, each naming the call and the field; empty when the plan is valid."""
    errs = []
    for step in steps:
        if step.kind == "call" or step.kind == "upload":
            errs += botocore_errors(step)
        errs += rule_errors(step, region)
    return errs
