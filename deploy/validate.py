"""Offline checks of a plan: botocore's ParamValidator against the real service models (SageMaker,
S3, ECR, CodeBuild, Application Auto Scaling), plus the rules botocore does not enforce (pool
maxima, timeouts, environment size, region consistency, capacities, placeholders left unfilled)."""
from __future__ import annotations

import json
from typing import Any

import botocore.session
from botocore.validate import ParamValidator

from .config import ACCOUNT_PLACEHOLDER, FORM_PLACEHOLDERS, NAME_RE, PLACEHOLDER_HINTS, VARIANT_TIMEOUTS
from .plan import Step, placeholders

_session = botocore.session.get_session()


def _shape(step: Step) -> Any:
    model = _session.get_service_model(step.service)
    return model.operation_model(step.operation).input_shape


def botocore_errors(step: Step) -> list[str]:
    try:
        shape = _shape(step)
    except Exception as exc:  # an unknown service or operation is a plan error, not a crash
        return [f"{step.service}.{step.operation}: not a botocore operation ({type(exc).__name__})"]
    report = ParamValidator().validate(step.params, shape)
    return [f"{step.service}.{step.operation}: {line.strip()}" for line in report.generate_report().splitlines()
            if line.strip() and not line.startswith("Parameter validation failed")] if report.has_errors() else []


def _variant_errors(where: str, variant: dict[str, Any]) -> list[str]:
    errs = []
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
    for key, lo, hi in VARIANT_TIMEOUTS.values():
        if key in variant and not lo <= variant[key] <= hi:
            errs.append(f"{where}: {key}={variant[key]} is outside {lo}..{hi}")
    return errs


def rule_errors(step: Step, region: str | None = None, allowed: frozenset[str] = frozenset()) -> list[str]:
    errs = []
    where = f"{step.service}.{step.operation}"
    p = step.params
    for key in ("ModelName", "EndpointConfigName", "EndpointName", "TransformJobName"):
        if isinstance(p.get(key), str) and not NAME_RE.fullmatch(p[key]):
            errs.append(f"{where}: {key} {p[key]!r} must be 1-63 letters, digits and hyphens")
    for variant in p.get("ProductionVariants", []):
        errs += _variant_errors(where, variant)
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
    if step.operation == "RegisterScalableTarget":
        lo, hi = p.get("MinCapacity", 0), p.get("MaxCapacity", 0)
        if not 1 <= lo <= hi:
            errs.append(f"{where}: capacities {lo}..{hi} need 1 <= MinCapacity <= MaxCapacity")
    target = (p.get("TargetTrackingScalingPolicyConfiguration") or {}).get("TargetValue")
    if target is not None and not target > 0:
        errs.append(f"{where}: TargetValue must be > 0")
    if step.operation == "CreateTransformJob" and not 0 < p.get("MaxPayloadInMB", 6) <= 100:
        errs.append(f"{where}: MaxPayloadInMB={p.get('MaxPayloadInMB')} is outside 1..100")
    if step.action == "upload" and not step.extra.get("file"):
        errs.append(f"{where}: upload of {p.get('Key')} names no local file")
    left = placeholders(p) - allowed
    if left:
        hints = dict.fromkeys(PLACEHOLDER_HINTS.get(x, "package first") for x in sorted(left))
        errs.append(f"{where}: unfilled {', '.join(sorted(left))} ({'; '.join(hints)})")
    return errs


def validate_plan(steps: list[Step], region: str | None = None, *, allow_account_placeholder: bool = False,
                  allow_form_placeholders: bool = False) -> list[str]:
    """All problems, each naming the call and the field; empty when the plan is valid. A plan shown
    before confirmation may keep `<account-id>` (apply fills it from STS, then validates again); a
    plan only printed (`python -m deploy plan`) may also keep the bucket and role placeholders,
    which nothing fills: apply refuses them."""
    allowed = (frozenset({ACCOUNT_PLACEHOLDER}) if allow_account_placeholder else frozenset()) | \
        (FORM_PLACEHOLDERS if allow_form_placeholders else frozenset())
    errs = []
    for step in steps:
        errs += botocore_errors(step)
        errs += rule_errors(step, region, allowed)
    return errs
