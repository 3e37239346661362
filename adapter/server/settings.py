"""The adapter's settings, read once from the environment at start-up (SageMaker passes only the
`Environment` of the model; the names mirror the llama.cpp DLC's SM_LLAMA_CPP_* style).

Engine settings (context, threads, GPU layers, batch, parallel sequences) are `EngineConfig` in
engine.py; everything about HTTP, limits and auth is here. The base class and the value rules are
adapter/env_settings.py.
"""
from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import AfterValidator, BeforeValidator, Field
from pydantic_settings import NoDecode

from adapter.env_settings import MIB, EnvSettings, Port, PositiveFloat, PositiveInt, comma_list, iso_date


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
