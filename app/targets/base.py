"""What every target is: `decide(request) -> TargetResult` with client-measured latency, never
raising; the API-key rule (only SEMIF_KEY_* variables or Streamlit secrets, read at each use, never
stored); the one HTTP path of the URL targets. The kinds are in local.py, remote.py, chat.py and
batch.py; registry.py says what each kind needs (form fields, validation, snippet, price)."""
from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, TypedDict

import httpx

from adapter.schema import DecisionRequest, DecisionResult

from app.settings import WorkbenchSettings
from app.targets.addresses import url_problem

log = logging.getLogger("semif.workbench")
Config = dict[str, Any]  # a target's settings as saved (JSON): per kind, its fields declared in registry.KINDS


class TargetSpec(TypedDict, total=False):
    """A target as saved (the built-in local ones have no created_at): registry.py builds it; the store
    keeps it (app/core/records.py names it among the records)."""
    name: str
    kind: str
    config: Config
    created_at: str


class Numerics(TypedDict):
    """The model fields that fix a result's bits (app/core/reuse.py keys stored results by them), as the
    model's own JSON names them."""
    sha256: str
    llama_cpp_version: str | None
    n_gpu_layers: int | None
    flash_attn: bool | None
    default_readout: str | None
    default_debias: str | None
    hidden_read: str | None  # how a hidden state is read (adapter ModelInfo.hidden_read); None: before it was said



NUMERICS = tuple(Numerics.__annotations__)


def numerics(model: Mapping[str, Any] | None) -> Numerics | None:
    """The model fields that fix a result's bits, or None when the model is not known by its sha256."""
    if not model or not model.get("sha256"):
        return None
    return {"sha256": model["sha256"], "llama_cpp_version": model.get("llama_cpp_version"),
            "n_gpu_layers": model.get("n_gpu_layers"), "flash_attn": model.get("flash_attn"),
            "default_readout": model.get("default_readout"), "default_debias": model.get("default_debias"),
            "hidden_read": model.get("hidden_read")}


class TargetError(RuntimeError):
    """A target that failed: the message is shown to the analyst as is (no stack trace)."""

    def __init__(self, message: str, raw: Any = None):
        super().__init__(message)
        self.raw = raw  # what the target answered, kept for the run's raw response


@dataclass
class TargetResult:
    row_id: str
    latency_s: float
    result: DecisionResult | None = None
    error: str | None = None
    request: Any = None  # what was sent, as JSON
    response: Any = None  # what came back, as JSON

    @property
    def ok(self) -> bool:
        return self.error is None and self.result is not None


@dataclass
class Target:
    name: str
    kind: str
    config: Config = field(default_factory=dict)
    batch_only = False  # scores whole sets with decide_batch (Batch Transform), never one row

    def describe(self) -> TargetSpec:
        return {"name": self.name, "kind": self.kind, "config": self.config}

    def prepare(self) -> None:
        """Work that must not count as latency (loading a model); errors surface per request."""

    def returns_hidden(self) -> bool:
        """Whether rows may ask this target for their hidden state (`hidden_state: true`), what a
        learned head is fitted on: a local engine can, a SemIf adapter that says so in /info can."""
        return False

    def numerics(self) -> Numerics | None:
        """The model this target runs now, as far as it fixes a result's bits (app/core/reuse.py), or None
        when the target cannot say without deciding (its results are then never reused)."""
        return None

    def decide(self, req: DecisionRequest) -> TargetResult:
        """One decision; never raises: a failure is a TargetResult with its error text."""
        try:
            self.prepare()
        except Exception:
            pass  # the same failure is reported, with its message, by the call below
        t0 = time.perf_counter()
        try:
            sent, raw, result = self._one(req)
            return TargetResult(req.id, time.perf_counter() - t0, result, None, sent, raw)
        except TargetError as exc:
            return TargetResult(req.id, time.perf_counter() - t0, None, str(exc), req.model_dump(exclude_none=True),
                                exc.raw)
        except Exception as exc:  # never let one target take a page or a batch down; the log keeps the traceback
            log.exception("target %s (%s) failed on row %s", self.name, self.kind, req.id)
            return TargetResult(req.id, time.perf_counter() - t0, None, f"unexpected {type(exc).__name__}: {exc}",
                                req.model_dump(exclude_none=True))

    def _one(self, req: DecisionRequest) -> tuple[Any, Any, DecisionResult]:
        raise NotImplementedError

    def row_block(self) -> int:
        """How many rows the runner sends in one `decide_many` call (1: one row a call)."""
        return 1

    def decide_many(self, requests: list[DecisionRequest]) -> list[TargetResult]:
        """Several rows in one call where the target can decide them together (a local engine); by default
        one `decide` each. Never raises: a failure is a row's TargetResult with its error text."""
        return [self.decide(r) for r in requests]

    def decide_batch(self, requests: list[DecisionRequest], on_event: Callable[[dict[str, Any]], None] | None = None
                     ) -> list[TargetResult]:
        """Many rows as one job (batch_only targets); others answer one row at a time."""
        raise NotImplementedError(f"{self.kind} targets answer one row at a time: use decide()")

    def test_connection(self) -> str:
        raise NotImplementedError


KEY_PREFIX = "SEMIF_KEY_"  # the only environment variables a target may send as its key


Secrets = Mapping[str, Any]  # Streamlit's secrets: a target may name one as its key


def key_env_problem(name: str, secrets: Secrets | None = None) -> str | None:
    """Why a target may not read `name` as its API key, or None. Only Streamlit secrets and
    environment variables named SEMIF_KEY_*: a target's URL is the user's choice, so a target that
    could name any variable could send this machine's AWS_SECRET_ACCESS_KEY (or any token) to it."""
    if not name or name in (secrets or {}):
        return None
    if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", name):
        return "the NAME of an environment variable holding the key (the key itself is never stored)"
    if not name.startswith(KEY_PREFIX) or name == KEY_PREFIX:
        return (f"{name!r} is not allowed: a target may only read environment variables whose name starts with "
                f"{KEY_PREFIX} (e.g. {KEY_PREFIX}{name.removeprefix(KEY_PREFIX) or 'MY_SERVER'}), or a Streamlit "
                "secret, so that no other secret of this machine can be sent to a target's URL: export the key "
                f"under such a name and enter that name")
    return None


def api_key(config: Config, secrets: Secrets | None) -> str | None:
    """The key named by `api_key_env`, from Streamlit secrets or a SEMIF_KEY_* environment variable -
    never stored. TargetError for any other name (also for a target saved before the rule), so
    nothing is sent."""
    env = config.get("api_key_env") or ""
    if not env:
        return None
    problem = key_env_problem(env, secrets)
    if problem:
        raise TargetError(f"api_key_env: {problem}")
    key = (secrets or {}).get(env) or os.environ.get(env)
    return None if key is None else str(key)


def bearer(key: str | None) -> dict[str, bytes]:
    """The Authorization header of a URL target with a key (the adapter's SM_SEMIF_API_KEY, a
    /v1/systemone server's or a chat server's), as UTF-8 bytes: a non-ASCII key is sent as is."""
    return {"Authorization": f"Bearer {key}".encode()} if key else {}


class KeyedTarget(Target):
    """A URL target that may send an API key: the key is read at each use, never kept or stored."""

    def __init__(self, name: str, kind: str, config: Config, secrets: Secrets | None = None):
        super().__init__(name, kind, config)
        self._secrets = secrets

    @property
    def api_key(self) -> str | None:
        return api_key(self.config, self._secrets)

    def auth(self) -> dict[str, bytes]:
        return bearer(self.api_key)


def _http_error(resp: httpx.Response) -> TargetError:
    try:
        body = resp.json()
        detail = body.get("detail", body) if isinstance(body, dict) else body
        if isinstance(detail, list):
            msg = "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" for d in detail if isinstance(d, dict))
        elif isinstance(detail, dict):
            msg = detail.get("message") or json.dumps(detail)
        else:
            msg = str(detail)
    except ValueError:
        body, msg = resp.text[:500], resp.text[:200]
    return TargetError(f"HTTP {resp.status_code}: {msg}", body)


def http_json(method: str, url: str, *, body: Any = None, headers: Mapping[str, Any] | None = None,
              timeout: float = 60) -> Any:
    """The one HTTP path of every URL target: a JSON call whose failures become TargetErrors that
    say what went wrong (unreachable, an HTTP error with the server's own message, not JSON)."""
    problem = url_problem(url, allow_link_local=WorkbenchSettings.from_env().allow_link_local_targets)
    if problem:  # checked again at each request: a saved target, or a name that resolves elsewhere now
        raise TargetError(f"{url}: {problem}")
    try:  # never a redirect: the key goes only to the URL the analyst entered
        resp = httpx.request(method, url, json=body, headers=headers, timeout=timeout, follow_redirects=False)
    except httpx.ConnectError as exc:
        raise TargetError(f"cannot reach {url}: {exc} - is the server running there and the URL right? "
                          "(a SemIf adapter starts with `make adapter`, port 8080)") from None
    except httpx.HTTPError as exc:
        raise TargetError(f"cannot reach {url}: {exc}") from None
    if resp.is_redirect:
        raise TargetError(f"{url} answered {resp.status_code}, a redirect to {resp.headers.get('location', '?')!r}: not "
                          "followed (the key would go with it) - enter the URL it points to, if you trust it")
    if resp.status_code != 200:
        raise _http_error(resp)
    try:
        return resp.json()
    except ValueError:
        raise TargetError(f"{url} did not answer JSON: {resp.text[:200]!r}") from None


def decision_from(data: Any, what: str) -> DecisionResult:
    """A SemIf adapter's answer as a DecisionResult, or a TargetError keeping the raw answer."""
    try:
        return DecisionResult.model_validate(data)
    except Exception:
        raise TargetError(f"not a SemIf decision result from {what}: {str(data)[:200]}", data) from None


