"""Local models loaded on demand, at most a few at a time (no Streamlit here: the pages and the
CLIs share it). A model is loaded the first time a local target asks for it; when more than
`max_loaded` are wanted, the least recently used one is released (its memory goes back once the
call using it, if any, returns)."""
from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Callable

from adapter.catalog import SHIPPED
from adapter.engine import Engine, EngineConfig
from adapter.models import Progress, default_ref, describe_model

from .settings import WorkbenchSettings


def model_key(ref: str | None) -> str:
    """One key per model: a shipped name, or an absolute path ('' means the default model)."""
    ref = (ref or "").strip() or default_ref()
    return ref if ref in SHIPPED else str(Path(ref).expanduser().resolve())


class EnginePool:
    def __init__(self, max_loaded: int | None = None, factory: Callable[..., Engine] | None = None):
        self.max_loaded = max(1, max_loaded or WorkbenchSettings.from_env().max_loaded_models)
        self._factory = factory or (lambda ref, progress: Engine(ref, EngineConfig.from_env(), progress=progress))
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._lock = threading.Lock()

    def is_loaded(self, ref: str | None) -> bool:
        return model_key(ref) in self._engines

    def loaded(self) -> list[str]:
        return list(self._engines)

    def describe(self, ref: str | None) -> str:
        return describe_model(model_key(ref))

    def get(self, ref: str | None, progress: Progress | None = None) -> Engine:
        key = model_key(ref)
        with self._lock:
            if key in self._engines:
                self._engines.move_to_end(key)
                return self._engines[key]
            while len(self._engines) >= self.max_loaded:
                self._engines.popitem(last=False)
            engine = self._factory(key, progress)
            self._engines[key] = engine
            return engine

    __call__ = get  # a pool is an engine provider for LocalTarget
