"""model.tar.gz with exactly one .gguf at its root (plus an optional calibrated policy), and the
SemIf image build context; streamed to S3 with progress, skipped when the same object is there.

Packaging is local and deterministic and happens before a plan is made, so the plan a person
confirms already carries the real checksums and image tag."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
import zipfile
from pathlib import Path
from typing import Any, Callable

from botocore.exceptions import ClientError

from adapter.policy import load_policy  # the adapter's own validator: what it would refuse is not shipped
from adapter.engine.models import file_sha256, resolve_model  # the adapter owns where the shipped model lives
from adapter.safe_path import inside
from adapter.engine.models import sha256_file  # noqa: F401  (re-exported: the executor checks confirmed files with it)

from .config import DeployConfig
from .plan import Package, package_keys

ROOT = Path(__file__).resolve().parent.parent
BUILD_CONTEXT = ["Dockerfile", "adapter", "data/policies", "deploy/buildspec.yml"]
KEEP_PACKAGES = 3  # model tarballs kept for reuse (each as large as its GGUF)


def make_model_tarball(gguf: Path, out: Path, policy: Path | None = None) -> tuple[Path, str]:
    """(path, sha256). Deterministic (fixed mtimes/owners), so the same inputs give the same hash
    and a re-run can skip the upload. Quantized GGUF barely compresses (Qwen2.5-Coder-1.5B Q4_K_M: 2%
    smaller at gzip level 1, for 26 s of deflate on 2 cores), so the gzip stream holds stored blocks
    (level 0, 1.8 s): still the .tar.gz SageMaker unpacks, at the speed of copying."""
    gguf = Path(gguf)
    if gguf.suffix != ".gguf" or not gguf.is_file():
        raise ValueError(f"{gguf} is not a .gguf file")
    out.parent.mkdir(parents=True, exist_ok=True)

    def add(tar: tarfile.TarFile, path: Path, name: str) -> None:
        info = tar.gettarinfo(str(path), arcname=name)
        info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
        with path.open("rb") as f:
            tar.addfile(info, f)

    # filename="": gzip would otherwise write the output's own name into its header (bytes that differ by path)
    with out.open("wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", compresslevel=0, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w") as tar:
        add(tar, gguf.resolve(), gguf.name)
        if policy:
            add(tar, Path(policy), "policy.json")
    return out, sha256_file(out)


def cached_model_tarball(gguf: Path, out: Path, policy: Path | None, cache: Path) -> tuple[Path, str]:
    """make_model_tarball, reused: the tarball is deterministic, so the same GGUF (path, size,
    mtime) and policy bytes give the same file; a second plan links it instead of re-packing a
    gigabyte. An entry whose size or mtime changed since its sha256 was recorded is packed again."""
    gguf = Path(gguf).resolve()
    if gguf.suffix != ".gguf" or not gguf.is_file():
        raise ValueError(f"{gguf} is not a .gguf file")
    st = gguf.stat()
    ident = hashlib.sha256(f"{gguf}|{st.st_size}|{st.st_mtime_ns}".encode())
    if policy:
        ident.update(Path(policy).read_bytes())
    entry = cache / f"{ident.hexdigest()[:32]}.tar.gz"
    meta = entry.with_suffix(".json")

    def stamp() -> dict[str, int]:
        s = entry.stat()
        return {"size": s.st_size, "mtime_ns": s.st_mtime_ns}

    try:
        known = json.loads(meta.read_text())
        fresh = entry.is_file() and {k: known[k] for k in ("size", "mtime_ns")} == stamp()
    except (OSError, ValueError, KeyError):
        fresh = False
    if not fresh:  # missing, or changed since it was recorded: pack it (again)
        tmp = entry.with_name(f"{entry.name}.{os.getpid()}.tmp")
        _, sha = make_model_tarball(gguf, tmp, policy)
        os.replace(tmp, entry)  # another process never links a half-written file
        known = {"sha256": sha, **stamp()}
        meta.write_text(json.dumps(known))
        for old in sorted(cache.glob("*.tar.gz"), key=lambda p: p.stat().st_mtime)[:-KEEP_PACKAGES]:
            old.unlink(missing_ok=True)  # deployment folders keep their own links
            old.with_suffix(".json").unlink(missing_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    try:
        os.link(entry, out)  # same folder tree: no second copy on disk
    except OSError:
        shutil.copyfile(entry, out)
    return out, str(known["sha256"])



def make_build_context(out: Path) -> tuple[Path, str]:
    """A deterministic zip of what the Dockerfile needs; its hash is the image tag."""
    files = []
    for entry in BUILD_CONTEXT:
        p = ROOT / entry
        files += [f for f in sorted(p.rglob("*")) if f.is_file() and "__pycache__" not in f.parts] if p.is_dir() else [p]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for f in files:
            info = zipfile.ZipInfo(str(f.relative_to(ROOT)), date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            z.writestr(info, f.read_bytes())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(buf.getvalue())
    return out, hashlib.sha256(buf.getvalue()).hexdigest()


def check_policy(policy: Path, gguf: Path) -> None:
    """The adapter's own policy validator on the file to ship, against the model being packaged: a
    policy the adapter would refuse at start-up (so /ping 503 until SageMaker gives up) or one
    calibrated on another model never goes into model.tar.gz. ValueError (PolicyError) naming why."""
    if gguf.suffix != ".gguf" or not gguf.is_file():
        raise ValueError(f"{gguf} is not a .gguf file")
    load_policy(policy, model_sha256=file_sha256(gguf.resolve()), model_file=gguf.name, what=f"--policy {policy}:")


def build_package(cfg: DeployConfig, work_dir: Path, gguf: Path | None = None) -> Package:
    """Package cfg's model (default: the shipped one) and, when the plan builds the SemIf image, the
    build context, under work_dir/<deployment id>/. Calls no AWS API."""
    if gguf is None:
        gguf = Path(cfg.model_path) if cfg.model_path else resolve_model().path
    key, source_key = package_keys(cfg)
    where = inside(Path(work_dir), cfg.deployment_id)
    policy = Path(cfg.policy_path) if cfg.policy_path else None
    if policy is not None:
        check_policy(policy, Path(gguf))
    model, sha = cached_model_tarball(gguf, where / "model.tar.gz", policy, Path(work_dir) / "cache")
    if not cfg.builds_image:
        return Package(key=key, sha256=sha, model_file=str(model))
    src, src_sha = make_build_context(where / "src.zip")
    return Package(key=key, sha256=sha, model_file=str(model), source_key=source_key, source_sha256=src_sha,
                   source_file=str(src))


def upload(s3: Any, path: Path, bucket: str, key: str, sha256: str,
           progress: Callable[[int, int], None] | None = None) -> str:
    """Stream to S3 (multipart for big files) unless an object with the same sha256 is there.
    Returns 'uploaded' or 'skipped (same sha256)'."""
    try:
        head = s3.head_object(Bucket=bucket, Key=key)
        if head.get("Metadata", {}).get("sha256") == sha256:
            return "skipped (same sha256 already in S3)"
    except ClientError as exc:
        if exc.response["Error"]["Code"] not in ("404", "NoSuchKey", "NotFound"):
            raise
    total = path.stat().st_size
    sent = 0

    def cb(n: int) -> None:
        nonlocal sent
        sent += n
        if progress:
            progress(sent, total)

    s3.upload_file(str(path), bucket, key, ExtraArgs={"Metadata": {"sha256": sha256}}, Callback=cb)
    return "uploaded"
