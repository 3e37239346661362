"""Every target kind in one table: what its form asks, how its config is checked, how it is built,
the code snippet that calls it, where its price comes from, whether it answers single rows.

A new kind is a Target subclass (base.py) plus one `Kind` entry in KINDS below; the Targets page,
the snippets, the cost table, the CLIs and the run loop read everything else from here."""
from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from adapter.engine.catalog import SHIPPED
from deploy.config import BUCKET_PATTERN, DEFAULT_TRANSFORM_INSTANCE, REGION_PATTERN, SAGEMAKER_NAME_PATTERN
from deploy.pricing import HOURLY_USD, first_choice

from app.settings import WorkbenchSettings
from app.targets.addresses import PRIVATE_NOTE, url_problem
from app.targets.base import KEY_PREFIX, Target, TargetError, key_env_problem
from app.targets.batch import BatchTransformTarget
from app.targets.chat import ChatTarget, chat_url
from app.targets.engines import model_key
from app.targets.local import LocalTarget
from app.targets.remote import SageMakerTarget, SemIfTarget, SystemOneTarget

Config = dict[str, Any]
Snippet = tuple[str, str, str]  # (title, language, code)
Deployments = Callable[[str], "dict | None"]  # endpoint name -> its stored deployment record
OWN_GGUF = "your own GGUF file…"
LOCAL_DEFAULT = {"name": "local", "kind": "local", "config": {"model": ""}}
NAME_RE = r"[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}"


@dataclass(frozen=True)
class BuildContext:
    """What building a target may need: the local model pool and the Streamlit secrets (key names)."""
    engine_provider: Callable[[str | None], Any] | None = None
    secrets: dict | None = None


@dataclass(frozen=True)
class Field:
    """One input of a kind's form. A field with `choices` is a select, drawn before the others so that
    a field `shown_if` (other field, value) can depend on it."""
    name: str
    label: str
    default: str = ""
    placeholder: str = ""
    help: str = ""
    choices: Callable[[], list[str]] | None = None
    format: Callable[[str], str] | None = None
    shown_if: tuple[str, str] | None = None


@dataclass(frozen=True)
class Kind:
    kind: str
    title: str
    make: Callable[[str, Config, BuildContext], Target]
    fields: tuple[Field, ...] = ()
    check: Callable[[Config], dict[str, str]] = lambda cfg: {}
    snippets: Callable[[Config, dict], list[Snippet]] = lambda cfg, body: [("Request", "json", json.dumps(body, indent=2))]
    price: Callable[[Config, Deployments | None], tuple[float | None, str]] = lambda cfg, deps: (None, "")
    to_config: Callable[[Config], Config] = field(default=lambda values: values)
    single_rows: bool = True  # answers one row at a time (Playground, Compare, the checks); else whole sets only
    keyed: bool = False  # may send an API key (named by api_key_env)
    priced: bool = True  # may carry its own hourly price (hourly_usd) for cost per 1,000 decisions
    build_check: Callable[[Config], dict[str, str]] = lambda cfg: {}  # checked again when built (no network)
    internal: tuple[str, ...] = ()  # config fields the workbench itself sets (not on the form), declared here too

    def declared(self) -> frozenset[str]:
        """Every field a config of this kind may hold: anything else is refused (saved or built) - an
        undeclared `endpoint_url` on a SageMaker target once sent boto3's credentials to its URL."""
        return frozenset({f.name for f in self.fields} | set(self.internal) | ({"api_key_env"} if self.keyed else set())
                         | ({"hourly_usd"} if self.priced else set()))

    def undeclared(self, cfg: Config) -> dict[str, str]:
        return {k: f"not a field of a {self.kind} target (it takes {', '.join(sorted(self.declared()))}): remove it"
                for k in cfg if k not in self.declared()}


# -- the kinds ---------------------------------------------------------------------------------------
def _curl(url: str, body: dict, key_env: str | None = None) -> str:
    """Every value shell-quoted; the key is the shell's expansion of a variable NAME (a Streamlit
    secret's name that is not a plain identifier is left for the reader to fill in). The body goes in a
    quoted heredoc: nothing in it is expanded, and a JSON document has no line that is only `JSON`."""
    parts = ["curl", "-sS", "-X", "POST", url, "-H", "Content-Type: application/json"]
    env = key_env if key_env and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key_env) else "YOUR_KEY_VARIABLE"
    auth = f' \\\n  -H "Authorization: Bearer ${env}"' if key_env else ""
    data = json.dumps(body, ensure_ascii=False, indent=2)
    return " ".join(shlex.quote(p) for p in parts) + auth + " \\\n  --data-binary @- <<'JSON'\n" + data + "\nJSON"


def _boto3(endpoint: str, region: str, body: dict) -> str:
    return ("import json\n\nimport boto3\n\n"
            f"runtime = boto3.client(\"sagemaker-runtime\", region_name={region!r})\n"
            f"row = {json.dumps(body, ensure_ascii=False, indent=4)}\n"
            f"response = runtime.invoke_endpoint(EndpointName={endpoint!r}, ContentType=\"application/json\",\n"
            "                                   Accept=\"application/json\", Body=json.dumps(row))\n"
            "result = json.loads(response[\"Body\"].read())\n"
            "print(result[\"top_option\"], dict(zip(result[\"option_ids\"], result[\"probabilities\"])))")


def _url_field() -> Field:
    return Field("url", "Base URL", placeholder="http://127.0.0.1:8080", help=f"The address rule: {PRIVATE_NOTE}.")


def _check_url(cfg: Config) -> dict[str, str]:
    problem = url_problem(str(cfg.get("url", "")), allow_link_local=WorkbenchSettings.from_env().allow_link_local_targets)
    return {"url": problem} if problem else {}


def _local(name: str, cfg: Config, ctx: BuildContext) -> Target:
    if ctx.engine_provider is None:
        raise TargetError("the local target needs an engine provider")
    return LocalTarget(name, cfg, ctx.engine_provider)


def _check_local(cfg: Config) -> dict[str, str]:
    ref = (cfg.get("model") or "").strip()
    if ref and ref not in SHIPPED and not (ref.endswith(".gguf") and os.path.isfile(os.path.expanduser(ref))):
        return {"model": f"a shipped model ({', '.join(m for m in SHIPPED if SHIPPED[m].offered)}) or the path of an "
                         "existing .gguf file on this machine"}
    return {}


def _local_config(values: Config) -> Config:
    choice = values.get("model") or ""
    return {"model": (values.get("model_path") or "").strip() if choice == OWN_GGUF else choice}


def _local_snippets(cfg: Config, body: dict) -> list[Snippet]:
    serve = f"python -m adapter serve --model {shlex.quote(model_key(cfg.get('model') or None))}"
    return [("Start the same engine as an HTTP server (port 8080; it keeps running)", "bash", serve),
            ("Then, in another terminal", "bash", _curl("http://127.0.0.1:8080/invocations", body))]


def _offered() -> list[str]:
    return [m for m in SHIPPED if SHIPPED[m].offered] + [OWN_GGUF]


def _semif(name: str, cfg: Config, ctx: BuildContext) -> Target:
    return SemIfTarget(name, cfg, ctx.secrets)


def _sagemaker(name: str, cfg: Config, ctx: BuildContext) -> Target:
    return SageMakerTarget(name, cfg)


def _check_region(cfg: Config) -> dict[str, str]:
    if cfg.get("region") and not re.fullmatch(REGION_PATTERN, str(cfg["region"])):
        return {"region": "an AWS region name, e.g. us-east-1"}
    return {}


def _check_endpoint(cfg: Config) -> dict[str, str]:
    errors = _check_region(cfg)
    if not re.fullmatch(SAGEMAKER_NAME_PATTERN, str(cfg.get("endpoint_name", ""))):
        errors["endpoint_name"] = "SageMaker endpoint names are 1-63 letters, digits and hyphens"
    if cfg.get("protocol") not in (None, "semif", "chat"):
        errors["protocol"] = "semif (the SemIf adapter image) or chat (the llama.cpp DLC)"
    return errors


def _sagemaker_snippets(cfg: Config, body: dict) -> list[Snippet]:
    region = cfg.get("region") or "us-east-1"
    args = ["aws", "sagemaker-runtime", "invoke-endpoint", "--region", region, "--endpoint-name", cfg["endpoint_name"],
            "--content-type", "application/json", "--cli-binary-format", "raw-in-base64-out"]
    cli = (" ".join(shlex.quote(str(a)) for a in args) + " \\\n  --body "
           + shlex.quote(json.dumps(body, ensure_ascii=False)) + " /dev/stdout")
    return [("boto3", "python", _boto3(cfg["endpoint_name"], region, body)), ("AWS CLI", "bash", cli)]


def _sagemaker_price(cfg: Config, deployments: Deployments | None) -> tuple[float | None, str]:
    """The instance type of the deployment behind the endpoint - for a GPU pool its first choice
    (priority 1), as the Deploy page prices it."""
    dep = deployments(cfg.get("endpoint_name", "")) if deployments is not None else None
    dep_cfg = (dep or {}).get("config") or {}
    if dep_cfg.get("compute") == "gpu":  # never the unused CPU type of a GPU deployment
        t = first_choice("gpu", None, dep_cfg.get("pools"))
        return (HOURLY_USD[t], f"{t} (its GPU pool's first choice)") if t in HOURLY_USD else (None, "")
    itype = dep_cfg.get("instance_type") or cfg.get("instance_type")
    if itype in HOURLY_USD:
        return HOURLY_USD[itype], str(itype)
    return None, ""


def _systemone(name: str, cfg: Config, ctx: BuildContext) -> Target:
    return SystemOneTarget(name, cfg, ctx.secrets)


def _chat(name: str, cfg: Config, ctx: BuildContext) -> Target:
    return ChatTarget(name, cfg, ctx.secrets)


def _chat_snippets(cfg: Config, body: dict) -> list[Snippet]:
    return [("cURL", "bash", _curl(chat_url(cfg["url"]), body, cfg.get("api_key_env") or None))]


def _batch(name: str, cfg: Config, ctx: BuildContext) -> Target:
    return BatchTransformTarget(name, cfg)


def _check_batch(cfg: Config) -> dict[str, str]:
    errors = {}
    if not re.fullmatch(SAGEMAKER_NAME_PATTERN, cfg.get("model_name", "")):
        errors["model_name"] = "the SageMaker model to reuse (a deployed SemIf model's name, e.g. semif-cpu-…-model)"
    if not re.fullmatch(BUCKET_PATTERN, cfg.get("bucket", "")):
        errors["bucket"] = "an S3 bucket name for the JSON Lines input and the results"
    errors.update(_check_region(cfg))
    if cfg.get("instance_type") and str(cfg["instance_type"]) not in HOURLY_USD and not re.fullmatch(
            r"ml\.[a-z0-9]+\.[a-z0-9]+", str(cfg["instance_type"])):
        errors["instance_type"] = "a SageMaker instance type, e.g. ml.m5.xlarge"
    if cfg.get("instance_count") and not str(cfg["instance_count"]).isdigit():
        errors["instance_count"] = "a whole number of instances, e.g. 1"
    return errors


KINDS: dict[str, Kind] = {k.kind: k for k in (
    Kind("local", "Local engine (in-process llama.cpp)", _local, check=_check_local, snippets=_local_snippets,
         fields=(Field("model", "Model", choices=_offered,
                       format=lambda m: m if m == OWN_GGUF else f"{SHIPPED[m].title} ({SHIPPED[m].size_text})"),
                 Field("model_path", "GGUF path", placeholder="~/models/my-model.gguf", shown_if=("model", OWN_GGUF))),
         to_config=_local_config, priced=False),
    Kind("semif", "SemIf adapter URL", _semif, fields=(_url_field(),), check=_check_url, keyed=True,
         snippets=lambda cfg, body: [("cURL", "bash", _curl(cfg["url"].rstrip("/") + "/invocations", body,
                                                             cfg.get("api_key_env") or None))]),
    Kind("systemone", "/v1/systemone server (TypeSafe Jev, Kev, laya-serve, our adapter)", _systemone,
         fields=(_url_field(), Field("model", "Model name sent in requests", "jev-latest")), check=_check_url,
         keyed=True, snippets=lambda cfg, body: [("cURL", "bash", _curl(cfg["url"].rstrip("/") + "/v1/systemone", body,
                                                                         cfg.get("api_key_env") or None))]),
    Kind("sagemaker", "SageMaker endpoint (SemIf adapter)", _sagemaker,
         fields=(Field("endpoint_name", "Endpoint name"), Field("region", "Region", "us-east-1")),
         check=_check_endpoint, snippets=_sagemaker_snippets, price=_sagemaker_price, build_check=_check_endpoint,
         internal=("protocol", "instance_type")),  # set by a deployment (deploy_records): chat for the DLC path
    Kind("sagemaker-batch", "SageMaker Batch Transform (labeled sets, SemIf model)", _batch,
         fields=(Field("model_name", "SageMaker model to reuse (a deployed SemIf model)"),
                 Field("bucket", "S3 bucket for the JSON Lines input and results"), Field("region", "Region", "us-east-1"),
                 Field("instance_type", "Instance type", DEFAULT_TRANSFORM_INSTANCE), Field("instance_count", "Instance count", "1")),
         check=_check_batch, build_check=_check_batch, single_rows=False),
    Kind("chat", "OpenAI-compatible chat completions (text generation)", _chat,
         fields=(_url_field(), Field("model", "Model name sent in requests", "default")), check=_check_url, keyed=True,
         snippets=_chat_snippets),
)}


# -- what the rest of the workbench asks ----------------------------------------------------------------
def kind_of(name: str) -> Kind:
    if name not in KINDS:
        raise TargetError(f"unknown target kind {name!r}; choose one of {', '.join(KINDS)}")
    return KINDS[name]


def titles() -> dict[str, str]:
    return {k: v.title for k, v in KINDS.items()}


def key_field() -> Field:
    return Field("api_key_env", f"API key: the name of an environment variable starting with {KEY_PREFIX}, or of a "
                 "Streamlit secret (optional)", placeholder=f"{KEY_PREFIX}MY_SERVER",
                 help=f"Only {KEY_PREFIX}* variables and Streamlit secrets can be sent as a target's key, so that no "
                      "other secret of this machine (AWS_SECRET_ACCESS_KEY, tokens) can reach a target's URL.")


def price_field() -> Field:
    return Field("hourly_usd", "Hourly price in USD (optional, for cost per 1,000 decisions)")


def form_fields(kind: str) -> list[Field]:
    """The kind's own fields, then the key and price fields every keyed / priced kind has."""
    k = kind_of(kind)
    return [*k.fields, *([key_field()] if k.keyed else []), *([price_field()] if k.priced else [])]


def config_from_form(kind: str, values: Config) -> Config:
    """A form's values as a saved config: strings stripped, empty values dropped."""
    raw = kind_of(kind).to_config({k: v.strip() if isinstance(v, str) else v for k, v in values.items()})
    return {k: v for k, v in raw.items() if v not in ("", None)}


def validate_target_spec(name: str, kind: str, config: Config, secrets: dict | None = None) -> dict[str, str]:
    """Field -> message for a target form; empty when valid. `secrets`: the Streamlit secrets, whose
    names may be given as api_key_env."""
    errors: dict[str, str] = {}
    if not re.fullmatch(NAME_RE, name or ""):
        errors["name"] = "use 1-64 letters, digits, spaces, '.', '_' or '-'"
    if kind not in KINDS:
        errors["kind"] = f"choose one of {', '.join(KINDS)}"
        return errors
    k = KINDS[kind]
    errors.update(k.undeclared(config))
    errors.update(k.check(config))
    if k.keyed and (problem := key_env_problem(config.get("api_key_env") or "", secrets)):
        errors["api_key_env"] = problem
    if k.priced and config.get("hourly_usd"):
        try:
            if float(config["hourly_usd"]) < 0:
                raise ValueError
        except ValueError:
            errors["hourly_usd"] = "a number of dollars per hour, e.g. 1.41"
    return errors


def build_target(spec: Mapping[str, Any], engine_provider: Callable | None = None, secrets: dict | None = None) -> Target:
    """A target from its saved spec {name, kind, config}; raise TargetError on a bad spec."""
    name, cfg = spec.get("name") or "", spec.get("config") or {}
    k = kind_of(str(spec.get("kind")))
    problems = {**k.undeclared(cfg), **k.build_check(cfg)}  # a saved spec too: nothing undeclared is ever
    if problems:  # built, whatever wrote it into the store (a URL's address is checked at each request)
        raise TargetError(f"target {name!r}: " + "; ".join(f"{f}: {m}" for f, m in problems.items()))
    try:
        return k.make(name, cfg, BuildContext(engine_provider, secrets))
    except KeyError as exc:
        raise TargetError(f"target {name!r}: missing setting {exc.args[0]!r}") from None


def single_rows(spec: Mapping[str, Any]) -> bool:
    return spec.get("kind") in KINDS and KINDS[spec["kind"]].single_rows


def snippets(spec: Mapping[str, Any], body: dict) -> list[Snippet]:
    """[(title, language, code)] that send `body` to the target the way the workbench did."""
    k = KINDS.get(str(spec.get("kind")))
    if k is None:
        return [("Request", "json", json.dumps(body, indent=2))]
    return k.snippets(spec.get("config") or {}, body)


def hourly_price(spec: Mapping[str, Any], deployments: Deployments | None = None) -> tuple[float | None, str]:
    """(hourly USD, what it is): the target's own price, else its kind's source (a SageMaker
    endpoint: the instance type of the deployment behind it)."""
    cfg = spec.get("config") or {}
    k = KINDS.get(str(spec.get("kind")))
    if k is None or not k.priced:
        return None, ""
    if cfg.get("hourly_usd"):
        return float(cfg["hourly_usd"]), "the target's own hourly price"
    return k.price(cfg, deployments)


# -- targets by name ---------------------------------------------------------------------------------
def builtin_specs() -> list[dict]:
    """`local` (the default model) and `local-<name>` for each other shipped model: several local
    models side by side need no set-up."""
    default = model_key(None)
    return [LOCAL_DEFAULT] + [{"name": f"local-{m.name}", "kind": "local", "config": {"model": m.name}}
                              for m in SHIPPED.values() if m.offered and m.name != default]


def target_specs(store, single_rows_only: bool = False) -> list[Mapping[str, Any]]:
    """The built-in local targets first, then the saved ones (a saved name overrides a built-in).
    `single_rows_only`: only targets that answer one row at a time (Playground, Compare, the checks)."""
    saved = store.list_targets()
    names = {t["name"] for t in saved}
    specs = [b for b in builtin_specs() if b["name"] not in names] + saved
    return [s for s in specs if not single_rows_only or single_rows(s)]


class UnknownTarget(ValueError):
    pass


def target_by_name(store, name: str, engine_provider: Callable, secrets: dict | None = None) -> Target:
    for spec in target_specs(store):
        if spec["name"] == name:
            return build_target(spec, engine_provider=engine_provider, secrets=secrets)
    raise UnknownTarget(f"--target {name!r}: no such target; saved targets: "
                        f"{', '.join(s['name'] for s in target_specs(store))}")
