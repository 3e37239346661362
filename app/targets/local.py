"""The engine in-process: models come from the workbench's EnginePool (loaded once, shared)."""
from __future__ import annotations

from typing import Any, Callable

from adapter.engine.engine import Engine
from adapter.schema import DecisionRequest, DecisionResult, RequestError

from app.targets.base import Config, Numerics, Target, TargetError, numerics

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

    def test_connection(self) -> str:
        info = self.engine().info
        return f"loaded {info.file} ({info.quantization}, {info.n_threads} threads, default readout {info.default_readout})"


