"""The engine in-process: models come from the workbench's EnginePool (loaded once, shared)."""
from __future__ import annotations

import time
from typing import Any, Callable

from adapter.engine.engine import Engine, EngineConfig
from adapter.schema import DecisionRequest, DecisionResult, RequestError

from app.targets.base import Config, Numerics, Target, TargetError, TargetResult, numerics

class LocalTarget(Target):
    def __init__(self, name: str, config: Config, engine_provider: Callable[[str | None], Engine]):
        super().__init__(name, "local", config)
        self._provider = engine_provider

    def prepare(self) -> None:
        self.engine()

    def returns_hidden(self) -> bool:
        return True

    def numerics(self) -> Numerics | None:
        return numerics(self.engine().info.public())

    def engine(self) -> Engine:
        try:
            return self._provider(self.config.get("model") or None)
        except Exception as exc:
            raise TargetError(f"the local model could not be loaded: {exc}") from None

    def _one(self, req: DecisionRequest) -> tuple[dict[str, Any], dict[str, Any], DecisionResult]:
        try:
            result = self.engine().score(req)
        except RequestError as exc:
            raise TargetError(f"{'.'.join(map(str, exc.loc))}: {exc.msg}") from None
        return req.model_dump(exclude_none=True), result.public(), result

    def row_block(self) -> int:
        """SM_SEMIF_ROW_BATCH, the engine's own setting (read here without loading a model: a source's model
        loads when its rows start): rows are sent that many at a time, and the engine decodes a block's
        head-layout rows together (Engine.score_many); 1, the default, sends one row a call."""
        try:
            return EngineConfig.from_env().row_batch
        except ValueError:  # the engine's load reports the bad setting on every row
            return 1

    def decide_many(self, requests: list[DecisionRequest]) -> list[TargetResult]:
        """The rows in one Engine.score_many call; each row's latency is its share of the call. A row the
        engine refuses fails the call: then every row is decided alone, so each carries its own error."""
        if len(requests) < 2:
            return [self.decide(r) for r in requests]
        try:
            engine = self.engine()
        except TargetError:
            return [self.decide(r) for r in requests]
        t0 = time.perf_counter()
        try:
            results = engine.score_many(requests)
        except Exception:  # a refused row (or any failure): each row alone, with its own result or error
            return [self.decide(r) for r in requests]
        share = (time.perf_counter() - t0) / len(requests)
        return [TargetResult(req.id, share, res, None, req.model_dump(exclude_none=True), res.public())
                for req, res in zip(requests, results)]

    def test_connection(self) -> str:
        info = self.engine().info
        return f"loaded {info.file} ({info.quantization}, {info.n_threads} threads, default readout {info.default_readout})"


