"""A local stand-in for SageMaker Batch Transform's data plane. moto's server accepts
CreateTransformJob but runs no container, writes no output and reports `Completed` at once; this
module does the missing part against a real adapter process:

- `run_job` reads the job's description from moto, its input objects from moto's S3, splits them
  by line, packs MultiRecord batches under MaxPayloadInMB, posts each batch to the adapter's
  `/invocations`, and writes `<input key>.out` under S3OutputPath, one response per line
  (AssembleWith=Line) - the way SageMaker does.
- `auto_run_transform_jobs` patches moto's backend (in this process, where ThreadedMotoServer
  runs) so a new job is `InProgress` until run_job finishes in a thread, then `Completed`, or
  `Failed` with the reason - so boto3's transform waiter has something real to wait for.

content_type: "application/jsonlines" is the Batch Transform contract (one result or error object
per input line). "application/json" posts each batch as a JSON array (the adapter's array shape)
and writes one line per array element: a stand-in while the adapter lacks jsonlines, with one
difference - a bad row fails the whole batch (422), so the job fails instead of carrying an error line.
"""
from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from typing import Any, Iterator

import boto3
import httpx

JSONLINES = "application/jsonlines"
MIB = 1024 * 1024


class RunnerError(RuntimeError):
    """What SageMaker would put in FailureReason."""


def batches(records: list[bytes], max_payload_mb: int, strategy: str) -> list[list[bytes]]:
    """SingleRecord: one record per request. MultiRecord: as many consecutive records as fit in
    MaxPayloadInMB (newline-joined); a record larger than that alone is an error, as in SageMaker."""
    cap = max_payload_mb * MIB
    out: list[list[bytes]] = []
    size = 0
    for rec in records:
        if len(rec) > cap:
            raise RunnerError(f"a record of {len(rec)} bytes exceeds MaxPayloadInMB={max_payload_mb}")
        if strategy == "SingleRecord" or not out or size + len(rec) + 1 > cap:
            out.append([rec])
            size = len(rec)
        else:
            out[-1].append(rec)
            size += len(rec) + 1
    return out


def _split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def post_batch(adapter_url: str, batch: list[bytes], content_type: str, accept: str, timeout: float) -> bytes:
    """One invocation; returns the response body as JSON Lines."""
    if content_type == JSONLINES:
        body = b"\n".join(batch)
    elif content_type == "application/json":
        body = b"[" + b",".join(batch) + b"]"
    else:
        body = b"\n".join(batch)  # whatever the job says; the adapter decides whether it speaks it
    resp = httpx.post(adapter_url + "/invocations", content=body, timeout=timeout,
                      headers={"content-type": content_type, "accept": accept})
    if resp.status_code != 200:
        raise RunnerError(f"ClientError: the model answered {resp.status_code}: {resp.text[:400]}")
    if content_type == "application/json":
        data = resp.json()
        return "\n".join(json.dumps(x) for x in (data if isinstance(data, list) else [data])).encode()
    return resp.content.rstrip(b"\n")


def run_job(job_name: str, *, aws_url: str, adapter_url: str, region: str = "us-east-1",
            content_type: str | None = None, gate: threading.Event | None = None) -> list[str]:
    """Process every input object of the job; returns the output keys written. content_type None:
    the job's own ContentType. gate: wait for it before writing outputs (lets a test see InProgress)."""
    sm = boto3.client("sagemaker", region_name=region, endpoint_url=aws_url)
    s3 = boto3.client("s3", region_name=region, endpoint_url=aws_url)
    job = sm.describe_transform_job(TransformJobName=job_name)
    tin, tout = job["TransformInput"], job["TransformOutput"]
    bucket, prefix = _split(tin["DataSource"]["S3DataSource"]["S3Uri"])
    out_bucket, out_prefix = _split(tout["S3OutputPath"])
    out_prefix = out_prefix if out_prefix.endswith("/") or not out_prefix else out_prefix + "/"
    keys = sorted(o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
                  for o in page.get("Contents", []))
    if not keys:
        raise RunnerError(f"no input objects under s3://{bucket}/{prefix}")
    timeout = float((job.get("ModelClientConfig") or {}).get("InvocationsTimeoutInSeconds", 600))
    written: dict[str, bytes] = {}
    for key in keys:
        data = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        records = [r for r in data.split(b"\n") if r.strip()] if tin.get("SplitType") == "Line" else [data]
        responses = [post_batch(adapter_url, b, content_type or tin.get("ContentType", JSONLINES),
                                tout.get("Accept", JSONLINES), timeout)
                     for b in batches(records, job.get("MaxPayloadInMB", 6), job.get("BatchStrategy", "MultiRecord"))]
        end = b"\n" if tout.get("AssembleWith") == "Line" else b""
        written[out_prefix + key[len(prefix):].lstrip("/") + ".out"] = b"".join(r + end for r in responses)
    if gate is not None and not gate.wait(120):
        raise RunnerError("nobody looked at the job while it ran (the test's gate never opened)")
    for out_key, body in written.items():
        s3.put_object(Bucket=out_bucket, Key=out_key, Body=body)
    return list(written)


@contextmanager
def auto_run_transform_jobs(aws_url: str, adapter_url: str, *, region: str = "us-east-1",
                            content_type: str | None = None, gate: threading.Event | None = None) -> Iterator[list[Any]]:
    """While active, every CreateTransformJob on the in-process moto server starts run_job in a
    thread; the job stays InProgress until it ends. Yields the list of finished jobs' (name, status)."""
    from moto.sagemaker.models import SageMakerModelBackend

    original = SageMakerModelBackend.create_transform_job
    threads: list[threading.Thread] = []
    finished: list[Any] = []

    def finish(job: Any) -> None:
        try:
            run_job(job.transform_job_name, aws_url=aws_url, adapter_url=adapter_url, region=region,
                    content_type=content_type, gate=gate)
            job.transform_job_status = "Completed"
        except Exception as exc:  # whatever went wrong is the job's FailureReason, as in SageMaker
            job.failure_reason = f"{type(exc).__name__}: {exc}"[:1024]
            job.transform_job_status = "Failed"
        finished.append((job.transform_job_name, job.transform_job_status))

    def create(self: Any, *args: Any, **kwargs: Any) -> Any:
        job = original(self, *args, **kwargs)
        job.transform_job_status = "InProgress"  # moto says Completed before anything ran
        t = threading.Thread(target=finish, args=(job,), daemon=True)
        threads.append(t)
        t.start()
        return job

    SageMakerModelBackend.create_transform_job = create  # type: ignore[method-assign]
    try:
        yield finished
    finally:
        SageMakerModelBackend.create_transform_job = original  # type: ignore[method-assign]
        if gate is not None:
            gate.set()
        for t in threads:
            t.join(300)
