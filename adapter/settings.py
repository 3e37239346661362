"""The adapter's settings, read once from the environment at start-up (SageMaker passes only the
`Environment` of the model; the names mirror the llama.cpp DLC's SM_LLAMA_CPP_* style).

Engine settings (context, threads, GPU layers, batch, parallel sequences) are `EngineConfig` in
engine.py; everything about HTTP, limits and auth is here.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import date
from typing import Mapping

MIB = 1024 * 1024


class SettingsError(ValueError):
    pass


def _num(env: Mapping[str, str], name: str, default, kind=int):
    raw = env.get(name)
    if raw in (None, ""):
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a {'number' if kind is float else 'whole number'}") from None
    if value <= 0:
        raise SettingsError(f"{name}={raw!r} must be positive")
    return value


def _date(env: Mapping[str, str], name: str) -> str | None:
    raw = env.get(name) or None
    if raw is not None:
        try:
            date.fromisoformat(raw)
        except ValueError:
            raise SettingsError(f"{name}={raw!r} is not a YYYY-MM-DD date") from None
    return raw


@dataclass(frozen=True)
class AdapterSettings:
    host: str = "127.0.0.1"  # the container sets SM_SEMIF_HOST=0.0.0.0; a laptop stays private
    port: int = 8080
    api_key: str | None = None  # SM_SEMIF_API_KEY: every route but /ping needs it when set
    model_name: str | None = None
    model_aliases: tuple[str, ...] = ("jev-latest", "semif-latest")
    model_release_date: str | None = None  # GET /v1/models; default: the catalog's, else the GGUF file's date
    policy_paths: str | None = None
    request_timeout: float = 60.0  # SageMaker's own invocation limit
    body_timeout: float = 10.0  # a body that stops arriving
    shutdown_grace: float = 20.0  # SageMaker kills 30 s after SIGTERM
    max_queue: int = 16
    max_rows: int = 256
    max_cost: int = 4096  # option readings per request: sum over rows of options x permutations
    max_body: int = 6 * MIB  # SageMaker's payload limit, as sent
    max_decoded: int = 16 * MIB  # after Content-Encoding is undone
    max_elements: int = 250_000  # JSON values in a body (counted as commas, '[' and '{' before parsing)
    max_depth: int = 64  # JSON nesting
    header_timeout: float = 10.0  # a request head (request line + headers) that stops arriving
    keep_alive_timeout: int = 5  # seconds an idle kept-alive connection stays open (uvicorn takes whole seconds)
    max_connections: int = 256  # open connections; past it the longest-waiting idle one is closed
    log_level: str = "info"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "AdapterSettings":
        env = os.environ if env is None else env
        aliases = env.get("SM_SEMIF_MODEL_ALIASES")
        return cls(
            host=env.get("SM_SEMIF_HOST") or cls.host,
            port=int(env.get("SAGEMAKER_BIND_TO_PORT") or 8080),
            api_key=env.get("SM_SEMIF_API_KEY") or None,
            model_name=env.get("SM_SEMIF_MODEL_NAME") or None,
            model_aliases=cls.model_aliases if aliases is None else tuple(a.strip() for a in aliases.split(",") if a.strip()),
            model_release_date=_date(env, "SM_SEMIF_MODEL_RELEASE_DATE"),
            policy_paths=env.get("SM_SEMIF_POLICY") or None,
            request_timeout=_num(env, "SM_SEMIF_REQUEST_TIMEOUT", cls.request_timeout, float),
            body_timeout=_num(env, "SM_SEMIF_BODY_TIMEOUT", cls.body_timeout, float),
            shutdown_grace=_num(env, "SM_SEMIF_SHUTDOWN_GRACE", cls.shutdown_grace, float),
            max_queue=_num(env, "SM_SEMIF_MAX_QUEUE", cls.max_queue),
            max_rows=_num(env, "SM_SEMIF_MAX_ROWS", cls.max_rows),
            max_cost=_num(env, "SM_SEMIF_MAX_COST", cls.max_cost),
            max_body=_num(env, "SM_SEMIF_MAX_BODY_BYTES", cls.max_body),
            max_decoded=_num(env, "SM_SEMIF_MAX_DECODED_BYTES", cls.max_decoded),
            max_elements=_num(env, "SM_SEMIF_MAX_ELEMENTS", cls.max_elements),
            header_timeout=_num(env, "SM_SEMIF_HEADER_TIMEOUT", cls.header_timeout, float),
            keep_alive_timeout=_num(env, "SM_SEMIF_KEEP_ALIVE_TIMEOUT", cls.keep_alive_timeout),
            max_connections=_num(env, "SM_SEMIF_MAX_CONNECTIONS", cls.max_connections),
            log_level=env.get("SM_SEMIF_LOG_LEVEL") or cls.log_level,
        )
