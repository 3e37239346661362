"""Settings read from the environment: the base and the value rules every settings class shares.

`EnvSettings` is the pydantic-settings base every environment-reading settings class of this
repository uses (the adapter's, adapter/server/settings.py; the decision log's; deploy/settings.py;
app/settings.py): each field names its variable exactly (case-sensitive, no prefix), an empty variable
means the default, no `.env` file or secrets folder is read, `from_env(mapping)` reads that mapping and nothing else, and a bad value is a
`SettingsError` naming the variable, the value and what is expected.
"""
from __future__ import annotations

import argparse
import math
import os
from contextvars import ContextVar
from datetime import date
from typing import Annotated, Any, ClassVar, Mapping, TypeVar

from pydantic import AfterValidator, BeforeValidator, ValidationError
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

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


def finite(text: str) -> float:
    """A number argument of a command line (python -m app, python -m deploy, the benches), in `number`'s words:
    argparse's float takes 'nan' and 'inf', this refuses them (argparse then exits 2 naming the argument)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


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
