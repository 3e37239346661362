"""The adapter's settings, read once from the environment at start-up (SageMaker passes only the
`Environment` of the model; the names mirror the llama.cpp DLC's SM_LLAMA_CPP_* style).

Engine settings (context, threads, GPU layers, batch, parallel sequences) are `EngineConfig` in
engine.py; everything about HTTP, limits and auth is here.

`EnvSettings` is the pydantic-settings base every environment-reading settings class of this
repository uses (the decision log's, deploy/settings.py, app/settings.py): each field names its
variable exactly (case-sensitive, no prefix), an empty variable means the default, no `.env` file or
secrets folder is read, `from_env(mapping)` reads that mapping and nothing else, and a bad value is a
`SettingsError` naming the variable, the value and what is expected.
"""
from __future__ import annotations

import math
import os
from contextvars import ContextVar
from datetime import date
from typing import Annotated, Any, ClassVar, Mapping, TypeVar

from pydantic import AfterValidator, BeforeValidator, Field, ValidationError
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, EnvSettingsSource, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

MIB = 1024 * 1024


class SettingsError(ValueError):
    """A setting the environment gives that cannot be used: the message names the variable, the value
    and what is expected."""


class MappingEnvSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping (os.environ, or a test's dict):
    an empty value counts as unset, except for the variables the class lists in `keep_empty`."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]):
        self._env = env
        super().__init__(settings_cls, case_sensitive=True)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        keep: frozenset[str] = getattr(self.settings_cls, "keep_empty", frozenset())
        return {k: v for k, v in self._env.items() if v != "" or k in keep}


S = TypeVar("S", bound="EnvSettings")
_reading: ContextVar[Mapping[str, str] | None] = ContextVar("semif_settings_env", default=None)  # from_env's mapping


class EnvSettings(BaseSettings):
    model_config = SettingsConfigDict(frozen=True, case_sensitive=True, extra="ignore", populate_by_name=True)
    keep_empty: ClassVar[frozenset[str]] = frozenset()  # variables whose empty value means something

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource) -> tuple[PydanticBaseSettingsSource, ...]:
        # keyword arguments, then the environment: from_env's mapping, else os.environ
        env = _reading.get()
        return init_settings, MappingEnvSource(settings_cls, os.environ if env is None else env)

    @classmethod
    def from_env(cls: type[S], env: Mapping[str, str] | None = None) -> S:
        """The settings from `env` only (default: os.environ); SettingsError naming each bad variable.
        (pydantic-settings reads its sources in __init__, so the mapping is handed over in a context
        variable: model_validate would run __init__ too, and read os.environ for what `env` lacks.)"""
        token = _reading.set(os.environ if env is None else env)
        try:
            return cls()
        except ValidationError as exc:
            raise SettingsError(describe(exc)) from None
        finally:
            _reading.reset(token)


def describe(exc: ValidationError) -> str:
    """`VARIABLE='value' what is expected` for each error, joined with '; '."""
    return "; ".join(f"{e['loc'][0] if e['loc'] else '?'}={e['input']!r} {e['msg']}" for e in exc.errors())


def whole(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return int(raw)
        except ValueError:
            raise PydanticCustomError("whole_number", "is not a whole number") from None
    return raw


def number(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            value = float(raw)
        except ValueError:
            raise PydanticCustomError("number", "is not a number") from None
        if not math.isfinite(value):
            raise PydanticCustomError("number", "is not a finite number")
        return value
    return raw


def positive(value: Any) -> Any:
    if value <= 0:
        raise PydanticCustomError("positive", "must be positive")
    return value


def port(value: int) -> int:
    if not 0 <= value <= 65535:
        raise PydanticCustomError("port", "is not a port number: 1-65535, or 0 for any free port")
    return value


def iso_date(value: str | None) -> str | None:
    if value is not None:
        try:
            date.fromisoformat(value)
        except ValueError:
            raise PydanticCustomError("date", "is not a YYYY-MM-DD date") from None
    return value


def comma_list(raw: Any) -> Any:
    return tuple(a.strip() for a in raw.split(",") if a.strip()) if isinstance(raw, str) else raw


PositiveInt = Annotated[int, BeforeValidator(whole), AfterValidator(positive)]
PositiveFloat = Annotated[float, BeforeValidator(number), AfterValidator(positive)]
Port = Annotated[int, BeforeValidator(whole), AfterValidator(port)]


class AdapterSettings(EnvSettings):
    keep_empty: ClassVar[frozenset[str]] = frozenset({"SM_SEMIF_MODEL_ALIASES"})  # empty: no aliases

    # the container sets SM_SEMIF_HOST=0.0.0.0; a laptop stays private
    host: str = Field("127.0.0.1", validation_alias="SM_SEMIF_HOST")
    port: Port = Field(8080, validation_alias="SAGEMAKER_BIND_TO_PORT")
    # every route but /ping needs it when set
    api_key: str | None = Field(None, validation_alias="SM_SEMIF_API_KEY")
    model_name: str | None = Field(None, validation_alias="SM_SEMIF_MODEL_NAME")
    model_aliases: Annotated[tuple[str, ...], NoDecode, BeforeValidator(comma_list)] = Field(
        ("jev-latest", "semif-latest"), validation_alias="SM_SEMIF_MODEL_ALIASES")  # comma-separated
    # GET /v1/models; default: the catalog's, else the GGUF file's date
    model_release_date: Annotated[str | None, AfterValidator(iso_date)] = Field(
        None, validation_alias="SM_SEMIF_MODEL_RELEASE_DATE")
    policy_paths: str | None = Field(None, validation_alias="SM_SEMIF_POLICY")  # files/folders, comma-separated
    request_timeout: PositiveFloat = Field(60.0, validation_alias="SM_SEMIF_REQUEST_TIMEOUT")  # SageMaker's own limit
    body_timeout: PositiveFloat = Field(10.0, validation_alias="SM_SEMIF_BODY_TIMEOUT")  # a body that stops arriving
    shutdown_grace: PositiveFloat = Field(20.0, validation_alias="SM_SEMIF_SHUTDOWN_GRACE")  # SageMaker kills 30 s after SIGTERM
    max_queue: PositiveInt = Field(16, validation_alias="SM_SEMIF_MAX_QUEUE")
    max_rows: PositiveInt = Field(256, validation_alias="SM_SEMIF_MAX_ROWS")
    # option readings per request: sum over rows of options x permutations
    max_cost: PositiveInt = Field(4096, validation_alias="SM_SEMIF_MAX_COST")
    max_body: PositiveInt = Field(6 * MIB, validation_alias="SM_SEMIF_MAX_BODY_BYTES")  # SageMaker's payload limit, as sent
    max_decoded: PositiveInt = Field(16 * MIB, validation_alias="SM_SEMIF_MAX_DECODED_BYTES")  # after Content-Encoding
    # JSON values in a body (counted as commas, '[' and '{' before parsing)
    max_elements: PositiveInt = Field(250_000, validation_alias="SM_SEMIF_MAX_ELEMENTS")
    max_depth: ClassVar[int] = 64  # JSON nesting (not a setting)
    # a request head (request line + headers) that stops arriving
    header_timeout: PositiveFloat = Field(10.0, validation_alias="SM_SEMIF_HEADER_TIMEOUT")
    # seconds an idle kept-alive connection stays open (uvicorn takes whole seconds)
    keep_alive_timeout: PositiveInt = Field(5, validation_alias="SM_SEMIF_KEEP_ALIVE_TIMEOUT")
    # open connections; past it the longest-waiting idle one is closed
    max_connections: PositiveInt = Field(256, validation_alias="SM_SEMIF_MAX_CONNECTIONS")
    log_level: str = Field("info", validation_alias="SM_SEMIF_LOG_LEVEL")
