"""A prompt's first segment (the instruction, or a policy with its examples) saved to disk as KV
state, so a restarted adapter or workbench loads it instead of evaluating it again.

Why it is exact: the file holds the KV cells llama.cpp computed for those tokens, byte for byte,
and the engine only loads a file whose stored tokens equal the segment's. Files are keyed by model
sha256 and context settings; the folder is trimmed to a size cap, oldest first.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from adapter.engine.models import CACHE_DIR

if TYPE_CHECKING:
    import llama_cpp

MIN_TOKENS = 32  # shorter segments are cheaper to evaluate than to load
MAX_BYTES = 512 * 1024 * 1024


def cache_dir() -> Path | None:
    """SM_SEMIF_KV_CACHE_DIR (or `off`), else ~/.cache/semif-workbench/kv."""
    raw = os.environ.get("SM_SEMIF_KV_CACHE_DIR", "")
    if raw.strip().lower() == "off":
        return None
    return Path(raw) if raw.strip() else CACHE_DIR / "kv"


class PrefixCache:
    def __init__(self, model_sha256: str, settings: str, folder: Path | None = None, max_bytes: int = MAX_BYTES):
        self.folder = folder if folder is not None else cache_dir()
        self.tag = hashlib.sha256(f"{model_sha256}|{settings}".encode()).hexdigest()[:16]
        self.max_bytes = max_bytes
        self.saved = self.loaded = 0

    def path(self, tokens: tuple[int, ...]) -> Path | None:
        if self.folder is None or len(tokens) < MIN_TOKENS:
            return None
        digest = hashlib.sha256(",".join(map(str, tokens)).encode()).hexdigest()[:32]
        return self.folder / f"{self.tag}-{digest}.kv"

    def load(self, ctx: llama_cpp.llama_context_p, tokens: tuple[int, ...]) -> bool:
        """Restore `tokens` as sequence 0 of an empty KV cache; False when there is no usable file."""
        import llama_cpp

        path = self.path(tokens)
        if path is None or not path.is_file():
            return False
        buf = (llama_cpp.llama_token * len(tokens))()
        n_out = ctypes.c_size_t(0)
        read = llama_cpp.llama_state_seq_load_file(ctx, str(path).encode(), 0, buf, len(tokens), ctypes.byref(n_out))
        if read == 0 or n_out.value != len(tokens) or tuple(buf[: n_out.value]) != tuple(tokens):
            path.unlink(missing_ok=True)  # stale or damaged: evaluate instead (and save anew)
            return False
        os.utime(path)
        self.loaded += 1
        return True

    def save(self, ctx: llama_cpp.llama_context_p, tokens: tuple[int, ...]) -> None:
        import llama_cpp

        path = self.path(tokens)
        if path is None or path.exists():
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            arr = (llama_cpp.llama_token * len(tokens))(*tokens)
            if llama_cpp.llama_state_seq_save_file(ctx, str(tmp).encode(), 0, arr, len(tokens)) == 0:
                tmp.unlink(missing_ok=True)
                return
            tmp.replace(path)
            self.saved += 1
            self._trim()
        except OSError:
            pass  # a read-only or full disk only costs speed

    def _trim(self) -> None:
        if self.folder is None:
            return
        files = sorted(self.folder.glob("*.kv"), key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in files)
        for p in files:
            if total <= self.max_bytes:
                break
            total -= p.stat().st_size
            p.unlink(missing_ok=True)
