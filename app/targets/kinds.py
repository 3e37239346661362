"""One interface, many targets: `decide(request) -> TargetResult` with client-measured latency.

- `local`     the engine in-process (models from the workbench's EnginePool)
- `semif`     a SemIf adapter URL (POST /invocations)
- `sagemaker` a SageMaker endpoint running the SemIf adapter (boto3 sagemaker-runtime), or the
              llama.cpp DLC (`protocol: chat`)
- `systemone` any /v1/systemone server: the policy is sent as a `choice` question
- `chat`      an OpenAI-compatible chat completions endpoint (the llama.cpp DLC text-generation
              path, llama-cpp-python's server, ...): the answer is generated and parsed back to an
              option; an answer that names no option is marked unparseable

Every target returns the same typed `DecisionResult`. Configs are saved by name without secrets:
an API key is read from the environment variable the config names (or Streamlit secrets).
"""
from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import httpx

from adapter.prompt import LETTERS, letters_messages
from adapter.schema import DecisionRequest, DecisionResult, ProbabilityStatus, RequestError

from app.core.settings import WorkbenchSettings

TargetKind = Literal["local", "semif", "systemone", "sagemaker", "sagemaker-batch", "chat"]
KINDS: dict[str, str] = {
    "local": "Local engine (in-process llama.cpp)",
    "semif": "SemIf adapter URL",
    "systemone": "/v1/systemone server (TypeSafe Jev, Kev, laya-serve, our adapter)",
    "sagemaker": "SageMaker endpoint (SemIf adapter)",
    "sagemaker-batch": "SageMaker Batch Transform (labeled sets, SemIf model)",
    "chat": "OpenAI-compatible chat completions (text generation)",
}
LOCAL_DEFAULT = {"name": "local", "kind": "local", "config": {"model": ""}}


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
    config: dict = field(default_factory=dict)
    batch_only = False  # scores whole sets with decide_batch (Batch Transform), never one row

    def describe(self) -> dict:
        return {"name": self.name, "kind": self.kind, "config": self.config}

    def prepare(self) -> None:
        """Work that must not count as latency (loading a model); errors surface per request."""

    def numerics(self) -> dict | None:
        """The model this target runs now, as far as it fixes a result's bits (app/reuse.py), or None
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
        except Exception as exc:  # never let one target take a page or a batch down
            return TargetResult(req.id, time.perf_counter() - t0, None, f"unexpected {type(exc).__name__}: {exc}",
                                req.model_dump(exclude_none=True))

    def _one(self, req: DecisionRequest) -> tuple[Any, Any, DecisionResult]:
        raise NotImplementedError

    def decide_batch(self, requests: list[DecisionRequest], on_event: Callable[[dict], None] | None = None
                     ) -> list[TargetResult]:
        """Many rows as one job (batch_only targets); others answer one row at a time."""
        raise NotImplementedError(f"{self.kind} targets answer one row at a time: use decide()")

    def test_connection(self) -> str:
        raise NotImplementedError


class LocalTarget(Target):
    def __init__(self, name: str, config: dict, engine_provider: Callable[[str | None], Any]):
        super().__init__(name, "local", config)
        self._provider = engine_provider

    def prepare(self) -> None:
        self.engine()

    def numerics(self) -> dict | None:
        from app.core.reuse import numerics

        return numerics(self.engine().info.public())

    def engine(self):
        try:
            return self._provider(self.config.get("model") or None)
        except Exception as exc:
            raise TargetError(f"the local model could not be loaded: {exc}") from None

    def _one(self, req):
        try:
            result = self.engine().score(req)
        except RequestError as exc:
            raise TargetError(f"{'.'.join(map(str, exc.loc))}: {exc.msg}") from None
        return req.model_dump(exclude_none=True), result.public(), result

    def test_connection(self) -> str:
        info = self.engine().info
        return f"loaded {info.file} ({info.quantization}, {info.n_threads} threads, default readout {info.default_readout})"


KEY_PREFIX = "SEMIF_KEY_"  # the only environment variables a target may send as its key


def key_env_problem(name: str, secrets: dict | None = None) -> str | None:
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


def api_key(config: dict, secrets: dict | None) -> str | None:
    """The key named by `api_key_env`, from Streamlit secrets or a SEMIF_KEY_* environment variable -
    never stored. TargetError for any other name (also for a target saved before the rule), so
    nothing is sent."""
    env = config.get("api_key_env") or ""
    if not env:
        return None
    problem = key_env_problem(env, secrets)
    if problem:
        raise TargetError(f"api_key_env: {problem}")
    return (secrets or {}).get(env) or os.environ.get(env)


def bearer(key: str | None) -> dict:
    """The Authorization header of a URL target with a key (the adapter's SM_SEMIF_API_KEY, a
    /v1/systemone server's or a chat server's), as UTF-8 bytes: a non-ASCII key is sent as is."""
    return {"Authorization": f"Bearer {key}".encode()} if key else {}


class KeyedTarget(Target):
    """A URL target that may send an API key: the key is read at each use, never kept or stored."""

    def __init__(self, name: str, kind: str, config: dict, secrets: dict | None = None):
        super().__init__(name, kind, config)
        self._secrets = secrets

    @property
    def api_key(self) -> str | None:
        return api_key(self.config, self._secrets)

    def auth(self) -> dict:
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


def http_json(method: str, url: str, *, body: Any = None, headers: dict | None = None, timeout: float = 60) -> Any:
    """The one HTTP path of every URL target: a JSON call whose failures become TargetErrors that
    say what went wrong (unreachable, an HTTP error with the server's own message, not JSON)."""
    try:
        resp = httpx.request(method, url, json=body, headers=headers, timeout=timeout)
    except httpx.ConnectError as exc:
        raise TargetError(f"cannot reach {url}: {exc} - is the server running there and the URL right? "
                          "(a SemIf adapter starts with `make adapter`, port 8080)") from None
    except httpx.HTTPError as exc:
        raise TargetError(f"cannot reach {url}: {exc}") from None
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


class SemIfTarget(KeyedTarget):
    def __init__(self, name: str, config: dict, secrets: dict | None = None):
        super().__init__(name, "semif", config, secrets)  # the key: an adapter started with SM_SEMIF_API_KEY
        self.url = config["url"].rstrip("/")
        self.timeout = float(config.get("timeout", 60))
        self._numerics: dict | None = None

    def numerics(self) -> dict | None:
        """From the adapter's /info (asked once per target object); None when it cannot be reached -
        the call that follows then reports why."""
        from app.core.reuse import numerics

        if self._numerics is None:
            try:
                data = http_json("GET", self.url + "/info", headers=self.auth(), timeout=5)
                self._numerics = numerics(data.get("model") if isinstance(data, dict) else None) or {}
            except TargetError:
                return None
        return self._numerics or None

    def _one(self, req):
        body = req.model_dump(exclude_none=True)
        data = http_json("POST", self.url + "/invocations", body=body, headers=self.auth(), timeout=self.timeout)
        return body, data, decision_from(data, self.url)

    def test_connection(self) -> str:
        """/info needs the key when the adapter has one (/ping never does), so this checks both."""
        data = http_json("GET", self.url + "/info", headers=self.auth(), timeout=5)
        model = (data.get("model") or {}).get("file", "") if isinstance(data, dict) else ""
        return f"{self.url} is up: {model}"


def aws_error(exc: Exception) -> TargetError:
    """boto3 failures in words (no credentials, access denied, ...), the same ones the Deploy page uses."""
    try:
        from deploy.executor import friendly

        return TargetError(f"SageMaker: {friendly(exc)}")
    except ImportError:  # pragma: no cover - deploy/ ships with the workbench
        return TargetError(f"SageMaker: {exc}")


class SageMakerTarget(Target):
    """A SageMaker endpoint; credentials from the normal AWS chain. `protocol` is `semif` (the SemIf
    adapter image) or `chat` (the llama.cpp DLC, whose /invocations is chat completions)."""

    def __init__(self, name: str, config: dict):
        super().__init__(name, "sagemaker", config)
        self.endpoint = config["endpoint_name"]
        self.region = config.get("region") or WorkbenchSettings.from_env().region
        self._client: Any = None

    def client(self, service: str = "sagemaker-runtime"):
        import boto3

        url = self.config.get("endpoint_url") or None  # tests: a local shim / moto server
        return boto3.client(service, region_name=self.region, endpoint_url=url)

    def _one(self, req):
        from botocore.exceptions import BotoCoreError, ClientError

        chat = self.config.get("protocol") == "chat"
        body = chat_body(req, "default") if chat else req.model_dump(exclude_none=True)
        try:
            if self._client is None:
                self._client = self.client()
            resp = self._client.invoke_endpoint(EndpointName=self.endpoint, ContentType="application/json",
                                                 Accept="application/json", Body=json.dumps(body))
            data = json.loads(resp["Body"].read())
        except (ClientError, BotoCoreError) as exc:
            raise aws_error(exc) from None
        except ValueError:
            raise TargetError("the endpoint did not answer JSON") from None
        return body, data, (chat_result(req, data) if chat else decision_from(data, self.endpoint))

    def test_connection(self) -> str:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            ep = self.client("sagemaker").describe_endpoint(EndpointName=self.endpoint)
        except (ClientError, BotoCoreError) as exc:
            raise aws_error(exc) from None
        return f"{self.endpoint} in {self.region}: {ep['EndpointStatus']}"


class SystemOneTarget(KeyedTarget):
    """Any /v1/systemone server: the policy becomes one `choice` question (criteria = option ids
    with their descriptions); the answer's probabilities come back in the policy's option order."""

    def __init__(self, name: str, config: dict, secrets: dict | None = None):
        super().__init__(name, "systemone", config, secrets)
        self.url = config["url"].rstrip("/")
        self.model = config.get("model") or "jev-latest"

    def _one(self, req):
        body = {"model": self.model, "state": req.state,
                "questions": {"decision": {"type": "choice", "instructions": req.question,
                                           "criteria": {o.id: (o.description or None) for o in req.options}}}}
        data = http_json("POST", self.url + "/v1/systemone", body=body, headers=self.auth(),
                         timeout=float(self.config.get("timeout", 120)))
        try:
            answer = data["answers"]["decision"]
            probs = [float(answer["probabilities"][o.id]) for o in req.options]
        except (KeyError, TypeError, ValueError):
            raise TargetError(f"not a /v1/systemone choice answer: {str(data)[:200]}", data) from None
        result = DecisionResult(id=req.id, option_ids=[o.id for o in req.options], probabilities=probs,
                                top_option=answer.get("choice") or req.options[max(range(len(probs)), key=probs.__getitem__)].id,
                                confidence=answer.get("confidence"), label_mass=answer.get("x_label_mass"),
                                readout=answer.get("x_readout") or "systemone", usage=data.get("usage"),
                                model={"file": data.get("model")})
        return body, data, result

    def test_connection(self) -> str:
        data = http_json("GET", self.url + "/v1/models", headers=self.auth(), timeout=5)
        names = [m.get("name") for m in data.get("models", [])]
        if self.model not in names:
            raise TargetError(f"{self.url} is up but does not serve {self.model!r}; it serves {', '.join(map(str, names))}")
        return f"{self.url} is up; serves {self.model}"


# -- chat completions (text generation) --------------------------------------------------------
def parse_chat_answer(text: str, req: DecisionRequest) -> int | None:
    """The option a generated answer names: a letter (A, 'B.', '(C)', 'Answer: D') or an option id."""
    n = len(req.options)
    t = (text or "").strip()
    m = re.match(r"^\W*(?:(?:the\s+)?answer(?:\s+is)?\s*[:\-]?\s*)?\(?([A-Z])(?:$|[.):,\n]|\s*$)", t, flags=re.I)
    if m and m.group(1).upper() in LETTERS[:n]:
        return LETTERS.index(m.group(1).upper())
    ids = [o.id.lower() for o in req.options]
    found = [i for i, oid in enumerate(ids) if re.search(rf"(?<!\w){re.escape(oid)}(?!\w)", t.lower())]
    return found[0] if len(found) == 1 else None


def chat_url(url: str) -> str:
    """A base URL (http://host:8080, .../v1) or the full chat-completions URL -> the full URL."""
    url = url.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    return url + ("/chat/completions" if url.endswith("/v1") else "/v1/chat/completions")


class ChatTarget(KeyedTarget):
    """Generated answers: probabilities come from top logprobs of the first answer token when the
    server returns them, else the parsed option gets 1.0 (marked `generated-one-hot`)."""

    def __init__(self, name: str, config: dict, secrets: dict | None = None):
        super().__init__(name, "chat", config, secrets)
        self.url = chat_url(config["url"])
        self.model = config.get("model") or "default"
        self.max_tokens = int(config.get("max_tokens", 4))

    def _one(self, req):
        body = chat_body(req, self.model, self.max_tokens)
        data = http_json("POST", self.url, body=body, headers=self.auth(), timeout=float(self.config.get("timeout", 120)))
        return body, data, chat_result(req, data)

    def test_connection(self) -> str:
        base = self.url.rsplit("/chat/completions", 1)[0]
        data = http_json("GET", base + "/models", headers=self.auth(), timeout=5)
        models = [m.get("id") for m in data.get("data", [])]
        return f"{base} is up; models: {', '.join(map(str, models)) or 'none listed'}"


def chat_body(req: DecisionRequest, model: str, max_tokens: int = 4) -> dict:
    """The letters prompt as chat messages: the same text the local letters readout reads."""
    return {"model": model, "messages": letters_messages(req.state, req.question, req.options),
            "max_tokens": max_tokens, "temperature": 0, "logprobs": True, "top_logprobs": 20}


def chat_result(req: DecisionRequest, data: Any) -> DecisionResult:
    """A chat completion parsed back to the decision shape; TargetError when it names no option."""
    try:
        choice = data["choices"][0]
        text = choice["message"]["content"] or ""
    except (KeyError, IndexError, TypeError):
        raise TargetError(f"not a chat completion response: {str(data)[:200]}") from None
    picked = parse_chat_answer(text, req)
    if picked is None:
        raise TargetError(f"unparseable answer: {text[:80]!r} names no single option", data)
    ids = [o.id for o in req.options]
    probs, status = _probs_from_logprobs(choice.get("logprobs"), len(ids))
    if probs is None or int(max(range(len(ids)), key=probs.__getitem__)) != picked:
        probs, status = [1.0 if i == picked else 0.0 for i in range(len(ids))], "generated-one-hot"
    return DecisionResult(id=req.id, option_ids=ids, probabilities=probs, top_option=ids[picked],
                          probability_status=status, generated_text=text, readout="chat-generation",
                          usage=data.get("usage"))


def _probs_from_logprobs(logprobs: dict | None, n: int) -> tuple[list[float] | None, ProbabilityStatus]:
    """Letter distribution from the first generated token's top logprobs, renormalised."""
    try:
        top = logprobs["content"][0]["top_logprobs"]  # type: ignore[index]
    except (TypeError, KeyError, IndexError):
        return None, "generated-logprobs"
    mass = [0.0] * n
    for item in top:
        tok = (item.get("token") or "").strip().upper()
        if len(tok) == 1 and tok in LETTERS[:n]:
            mass[LETTERS.index(tok)] += math.exp(item["logprob"])
    total = sum(mass)
    if total <= 0:
        return None, "generated-logprobs"
    return [m / total for m in mass], "generated-logprobs"


def build_target(spec: dict, engine_provider: Callable | None = None, secrets: dict | None = None) -> Target:
    """A target from its saved spec {name, kind, config}; raise TargetError on a bad spec."""
    kind, name, cfg = spec.get("kind"), spec.get("name") or "", spec.get("config") or {}
    try:
        if kind == "local":
            if engine_provider is None:
                raise TargetError("the local target needs an engine provider")
            return LocalTarget(name, cfg, engine_provider)
        if kind == "semif":
            return SemIfTarget(name, cfg, secrets)
        if kind == "sagemaker":
            return SageMakerTarget(name, cfg)
        if kind == "chat":
            return ChatTarget(name, cfg, secrets)
        if kind == "systemone":
            return SystemOneTarget(name, cfg, secrets)
        if kind == "sagemaker-batch":
            from app.targets.batch import BatchTransformTarget

            return BatchTransformTarget(name, cfg)
    except KeyError as exc:
        raise TargetError(f"target {name!r}: missing setting {exc.args[0]!r}") from None
    raise TargetError(f"unknown target kind {kind!r}; choose one of {', '.join(KINDS)}")


def validate_target_spec(name: str, kind: str, config: dict, secrets: dict | None = None) -> dict[str, str]:
    """Field -> message for a target form; empty when valid. `secrets`: the Streamlit secrets, whose
    names may be given as api_key_env."""
    errors = {}
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}", name or ""):
        errors["name"] = "use 1-64 letters, digits, spaces, '.', '_' or '-'"
    if kind in ("semif", "chat", "systemone"):
        url = config.get("url", "")
        if not re.match(r"^https?://[^/\s]+", url):
            errors["url"] = "give a full http(s):// URL, e.g. http://127.0.0.1:8080"
    if kind == "sagemaker":
        if not re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}", config.get("endpoint_name", "")):
            errors["endpoint_name"] = "SageMaker endpoint names are 1-63 letters, digits and hyphens"
    if kind == "sagemaker-batch":
        if not re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}", config.get("model_name", "")):
            errors["model_name"] = "the SageMaker model to reuse (a deployed SemIf model's name, e.g. semif-cpu-…-model)"
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", config.get("bucket", "")):
            errors["bucket"] = "an S3 bucket name for the JSON Lines input and the results"
        if config.get("region") and not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", config["region"]):
            errors["region"] = "e.g. us-east-1"
    if kind == "local" and config.get("model"):
        from adapter.catalog import SHIPPED

        ref = config["model"].strip()
        if ref not in SHIPPED and not (ref.endswith(".gguf") and os.path.isfile(os.path.expanduser(ref))):
            errors["model"] = (f"a shipped model ({', '.join(m for m in SHIPPED if SHIPPED[m].offered)}) or the path "
                               "of an existing .gguf file on this machine")
    key_problem = key_env_problem(config.get("api_key_env") or "", secrets)
    if kind in ("semif", "chat", "systemone") and key_problem:
        errors["api_key_env"] = key_problem
    if kind not in KINDS:
        errors["kind"] = f"choose one of {', '.join(KINDS)}"
    return errors
