"""Local models loaded on demand, at most a few at a time (no Streamlit here: the pages and the
CLIs share it). A model is loaded the first time a local target asks for it; when more than
`max_loaded` are wanted, the least recently used one that is not scoring is released.

- One load per model: a session asking for a model another session is loading waits for that
  load only (a minutes-long first assembly of one model never blocks another model's `get()`), and
  a failed load is reported to everyone waiting on it, then tried again on the next ask.
- An engine that is scoring (its lock is held) is never evicted; when every loaded engine is busy
  the pool goes over `max_loaded` for a while instead of dropping one mid-call (logged).
- Room is made before a model loads (issue 45): evicting after the load held one model more than
  `max_loaded` at the peak (calibrate with three head sources: three models at once).
- Each loaded engine gets a generation number: a reload after eviction is a new generation, so
  "the first call of this model instance" (cold latency) never mistakes a new engine for an old
  one, as `id()` of a freed object could.
"""
from __future__ import annotations

import gc
import itertools
import logging
import threading
from collections import OrderedDict
from concurrent.futures import Future
from pathlib import Path
from typing import Callable

from adapter.engine.catalog import SHIPPED
from adapter.engine.engine import Engine, EngineConfig
from adapter.engine.models import Progress, default_ref, describe_model

from app.settings import WorkbenchSettings

log = logging.getLogger("semif.workbench")
_GENERATIONS = itertools.count(1)


def model_key(ref: str | None) -> str:
    """One key per model: a shipped name, or an absolute path ('' means the default model)."""
    ref = (ref or "").strip() or default_ref()
    return ref if ref in SHIPPED else str(Path(ref).expanduser().resolve())


class EnginePool:
    def __init__(self, max_loaded: int | None = None, factory: Callable[..., Engine] | None = None):
        self.max_loaded = max(1, max_loaded or WorkbenchSettings.from_env().max_loaded_models)
        self._factory = factory or (lambda ref, progress: Engine(ref, EngineConfig.from_env(), progress=progress))
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._loading: dict[str, Future[Engine]] = {}
        self._lock = threading.Lock()  # guards the two dicts only; never held while a model loads

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
            pending = self._loading.get(key)
            if pending is None:
                pending = self._loading[key] = Future()
                loader = True
                self._make_room()  # before the load, not after: the evicted model's memory is free first
            else:
                loader = False
        if not loader:
            return pending.result()  # another session is loading this model: wait for it (or its error)
        try:
            engine = self._factory(key, progress)
        except BaseException as exc:
            with self._lock:
                self._loading.pop(key, None)
            pending.set_exception(exc)
            raise
        engine.generation = next(_GENERATIONS)
        with self._lock:
            self._make_room()
            self._engines[key] = engine
            self._loading.pop(key, None)
        pending.set_result(engine)
        return engine

    def _make_room(self) -> None:
        """Release least recently used engines that are not scoring until one more fits."""
        released = 0
        for key in list(self._engines):
            if len(self._engines) < self.max_loaded:
                break
            if self._engines[key].lock.acquire(blocking=False):  # not scoring right now: safe to let go
                self._engines[key].lock.release()
                del self._engines[key]
                released += 1
        if released:  # an engine is in a reference cycle (its llama.cpp abort callback): free its memory now
            gc.collect()
        if len(self._engines) >= self.max_loaded:
            log.warning("every loaded model is scoring: keeping %d loaded (SEMIF_MAX_LOADED_MODELS=%d) until one "
                        "is free", len(self._engines) + 1, self.max_loaded)

    __call__ = get  # a pool is an engine provider for LocalTarget
