"""Batch Transform for evaluation runs: decision rows as JSON Lines in S3, one SageMaker transform
job (reusing a deployed model by name, or creating one from the package), and the `.out` objects
read back into one result per row, in input order.

Same shape as a deployment: `prepare_transform` writes the input files locally (deterministic,
hashed), `transform_plan` is pure and validated offline, `Executor.run_transform` runs it.
Resume: pass only the rows that have no result yet; results carry their row's id.

A job that reuses a model needs only a `TransformSite` (region, bucket, prefix): the model already
has its execution role and image. A full DeployConfig, role ARN included, is needed only to create
the model from a package."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from .config import (BUCKET_PLACEHOLDER, BUCKET_RE, DEFAULT_PREFIX, DEFAULT_TRANSFORM_INSTANCE, NAME_RE, REGION_RE,
                     DeployConfig, FormErrors, form_text, suffix, text_problem)
from .errors import DeployError
from .plan import Package, Step, build_steps, model_steps, upload_step

CONTENT_TYPE = "application/jsonlines"
MB = 1_000_000  # a record must fit the smaller reading of "MB" ...
MIB = 1024 * 1024  # ... and the adapter's caps must allow the larger one
INVOCATION_TIMEOUT = 3600  # ModelClientConfig.InvocationsTimeoutInSeconds maximum
BatchStrategy = Literal["MultiRecord", "SingleRecord"]


@dataclass(frozen=True)
class TransformSite:
    """Where a transform job that reuses an existing SageMaker model runs: the region, and the bucket
    and key prefix its input and output go through."""
    region: str
    bucket: str
    prefix: str = DEFAULT_PREFIX

    def tags(self) -> list[dict[str, str]]:
        return [{"Key": "created-by", "Value": "semif-workbench"}]


def site_from_form(form: Mapping[str, Any], *, placeholders: bool = False) -> TransformSite:
    """A TransformSite from form fields `region` and `bucket` (the same checks as config_from_form),
    or FormErrors naming each bad one. `placeholders`: a plan only printed may lack the bucket."""
    region, bucket = form_text(form, "region"), form_text(form, "bucket")
    problems = {"region": text_problem(region, "Region", REGION_RE, required=True)}
    if bucket or not placeholders:
        problems["bucket"] = text_problem(bucket, "S3 bucket", BUCKET_RE, required=True)
    errors = {k: v for k, v in problems.items() if v}
    if errors:
        raise FormErrors(errors)
    return TransformSite(region, bucket or BUCKET_PLACEHOLDER)


@dataclass(frozen=True)
class InputPart:
    key: str  # S3 key of this JSON Lines file
    file: str  # the local copy that is uploaded
    sha256: str
    ids: tuple[str, ...]  # row ids, in line order


@dataclass
class TransformJob:
    name: str
    parts: list[InputPart]
    input_prefix: str  # S3 key prefix (no bucket), ends with "/"
    output_prefix: str
    model_name: str = ""  # reuse this SageMaker model; empty: create the DeployConfig's model from the package
    instance_type: str = DEFAULT_TRANSFORM_INSTANCE
    instance_count: int = 1
    max_concurrent_transforms: int = 1  # the adapter serialises calls: more only helps on several workers
    max_payload_mb: int = 1  # the smallest MultiRecord batch; bigger batches risk the 1 h invocation limit
    batch_strategy: BatchStrategy = "MultiRecord"
    environment: dict[str, str] = field(default_factory=dict)


def _cost(row: Mapping[str, Any]) -> int:
    """Option readings a row asks for (the adapter's SM_SEMIF_MAX_COST unit)."""
    n = len(row.get("options") or []) or 2
    return n * (n if row.get("permute") else 1)


def adapter_environment(lines: list[bytes], costs: list[int], max_payload_mb: int, strategy: BatchStrategy) -> dict[str, str]:
    """Settings that let the SemIf adapter take the largest batch SageMaker can send for these rows:
    row and cost caps from the rows themselves, the body cap from MaxPayloadInMB, and the
    invocation timeout instead of the real-time 60 s."""
    cap, rows, used = max_payload_mb * MIB, 0, 0
    for size in sorted(len(line) + 1 for line in lines):
        if strategy == "SingleRecord" or used + size > cap:
            break
        rows, used = rows + 1, used + size
    rows = max(rows, 1)
    cost = sum(sorted(costs, reverse=True)[:rows])
    return {"SM_SEMIF_MAX_ROWS": str(max(rows, 256)), "SM_SEMIF_MAX_COST": str(max(cost, 4096)),
            "SM_SEMIF_MAX_BODY_BYTES": str(max(cap, 6 * MIB)), "SM_SEMIF_MAX_DECODED_BYTES": str(max(cap, 16 * MIB)),
            "SM_SEMIF_REQUEST_TIMEOUT": str(INVOCATION_TIMEOUT)}


def prepare_transform(rows: Sequence[Mapping[str, Any]], work_dir: Path, *, name: str = "", prefix: str = DEFAULT_PREFIX,
                      n_parts: int = 0, **settings: Any) -> TransformJob:
    """Write rows as JSON Lines files under work_dir/<name>/ (split into n_parts contiguous files,
    default one per instance) and describe the job. Raises ValueError naming bad rows. `settings`
    are TransformJob fields (model_name, instance_type, instance_count, ...)."""
    name = name or f"semif-tf-{suffix()}"
    if not NAME_RE.fullmatch(name):
        raise ValueError(f"job name {name!r} must be 1-63 letters, digits and hyphens")
    probe = TransformJob(name, [], "", "", **settings)
    problems, seen = [], set()
    lines = []
    for n, row in enumerate(rows, 1):
        rid = row.get("id") if isinstance(row, Mapping) else None
        if not isinstance(rid, str) or not rid:
            problems.append(f"row {n}: needs a non-empty string id (results are keyed by it)")
        elif rid in seen:
            problems.append(f"row {n}: duplicate id {rid!r}")
        seen.add(rid)
        line = json.dumps(row, ensure_ascii=False, separators=(",", ":")).encode()
        if len(line) > probe.max_payload_mb * MB:
            problems.append(f"row {n}: {len(line)} bytes does not fit MaxPayloadInMB={probe.max_payload_mb}")
        lines.append(line)
    if not rows:
        problems.append("no rows to transform")
    if problems:
        raise ValueError("; ".join(problems[:20]) + (f" (+{len(problems) - 20} more)" if len(problems) > 20 else ""))
    k = max(1, min(n_parts or probe.instance_count, len(lines)))
    base = f"{prefix}/transform/{name}"
    out_dir = Path(work_dir) / name
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = []
    for i in range(k):
        lo, hi = i * len(lines) // k, (i + 1) * len(lines) // k
        data = b"".join(line + b"\n" for line in lines[lo:hi])
        path = out_dir / f"part-{i:05d}.jsonl"
        path.write_bytes(data)
        parts.append(InputPart(f"{base}/input/{path.name}", str(path), hashlib.sha256(data).hexdigest(),
                               tuple(str(r["id"]) for r in rows[lo:hi])))
    env = adapter_environment(lines, [_cost(r) for r in rows], probe.max_payload_mb, probe.batch_strategy)
    return TransformJob(name, parts, f"{base}/input/", f"{base}/output/",
                        **{**settings, "environment": {**env, **settings.get("environment", {})}})


def output_key(job: TransformJob, part: InputPart) -> str:
    """SageMaker writes <S3OutputPath>/<input key relative to the input prefix>.out."""
    return job.output_prefix + part.key[len(job.input_prefix):] + ".out"


def transform_plan(where: DeployConfig | TransformSite, job: TransformJob, pkg: Package | None = None) -> list[Step]:
    """Upload the inputs, (create the model,) run the job, wait, read every output back. `where` is a
    TransformSite when the job reuses a model (job.model_name), the DeployConfig to create it otherwise."""
    steps: list[Step] = []
    if job.model_name:
        model = job.model_name
    else:
        if not isinstance(where, DeployConfig):
            raise ValueError("no model name to reuse: give one, or a deployment config (role, image) and the "
                             "package to create the model from")
        if pkg is None:
            raise ValueError("no model name to reuse: give the package to create the model from")
        steps += (build_steps(where, pkg) if where.builds_image else []) + model_steps(where, pkg)
        model = where.model_name
    n = len(job.parts)
    steps += [upload_step(where.bucket, p.key, p.sha256, p.file, "input", f"upload input {i}/{n} ({len(p.ids)} rows)")
              for i, p in enumerate(job.parts, 1)]
    params = {
        "TransformJobName": job.name, "ModelName": model, "MaxConcurrentTransforms": job.max_concurrent_transforms,
        "MaxPayloadInMB": job.max_payload_mb, "BatchStrategy": job.batch_strategy,
        "ModelClientConfig": {"InvocationsTimeoutInSeconds": INVOCATION_TIMEOUT, "InvocationsMaxRetries": 0},
        "Environment": job.environment,
        "TransformInput": {"DataSource": {"S3DataSource": {"S3DataType": "S3Prefix",
                                                           "S3Uri": f"s3://{where.bucket}/{job.input_prefix}"}},
                           "ContentType": CONTENT_TYPE, "SplitType": "Line", "CompressionType": "None"},
        "TransformOutput": {"S3OutputPath": f"s3://{where.bucket}/{job.output_prefix}", "Accept": CONTENT_TYPE,
                            "AssembleWith": "Line"},
        "TransformResources": {"InstanceType": job.instance_type, "InstanceCount": job.instance_count},
        "Tags": where.tags()}
    steps += [
        Step("sagemaker", "CreateTransformJob", params,
             f"transform job on {job.instance_count} x {job.instance_type}, {job.batch_strategy} batches of at most "
             f"{job.max_payload_mb} MB, {sum(len(p.ids) for p in job.parts)} rows in {n} files"),
        Step("sagemaker", "DescribeTransformJob", {"TransformJobName": job.name},
             "wait until Completed (boto3 waiter transform_job_completed_or_stopped)", action="wait-transform",
             extra={"output_bucket": where.bucket, "output_prefix": job.output_prefix, "parts": n}),
    ]
    steps += [Step("s3", "GetObject", {"Bucket": where.bucket, "Key": output_key(job, p)},
                   f"read results {i}/{n}", action="read-output", extra={"rows": len(p.ids)})
              for i, p in enumerate(job.parts, 1)]
    return steps


def collect_results(job: TransformJob, steps: list[Step], outputs: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    """One result (or error object) per input row, in input order; a line's id must be its row's."""
    bucket = next(s.params["Bucket"] for s in steps if s.action == "read-output")
    results: list[dict[str, Any]] = []
    for part in job.parts:
        key = output_key(job, part)
        lines = outputs.get(key)
        if lines is None:
            raise DeployError(f"no output read for s3://{bucket}/{key}")
        if len(lines) != len(part.ids):
            raise DeployError(f"s3://{bucket}/{key} has {len(lines)} lines for {len(part.ids)} rows")
        for rid, line in zip(part.ids, lines):
            if not isinstance(line, dict):
                raise DeployError(f"s3://{bucket}/{key}: a line is {type(line).__name__}, not a JSON object")
            if line.setdefault("id", rid) != rid:
                raise DeployError(f"s3://{bucket}/{key}: result for {line['id']!r} where {rid!r} was expected")
            results.append(line)
    return results


def by_id(results: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Results keyed by row id, to merge into a run that already has some (resume)."""
    return {str(r["id"]): r for r in results}
