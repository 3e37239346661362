"""Calibrated policies in the MLflow model registry (SEMIF_MLFLOW_TRACKING_URI): register, promote with a
shadow check, roll back, list - and `resolve()`, the one reader of a policy by reference.

- One registered model per policy id, `semif-<policy id>` (tag `semif.policy_id`); one version per
  calibrated policy (its JSON and model identity, `policy/policy.json` + `policy/model.json`, logged on a
  run of the policy's experiment). A registered version is the `candidate`; `production` moves only by
  promote and rollback, each audited in the workbench store (audit log, `registry:<name>`) and in MLflow
  (the registered model's `semif.production_history` tag and the version's `semif.promoted_at`).
- `resolve("models:/NAME@ALIAS" | "models:/NAME/VERSION")` downloads the version's policy file, validates
  it with the adapter's load_policy, and keeps it as a plain file (`<NAME>.v<VERSION>.policy.json`): what
  Deploy packages, check and robustness read - an image never holds a live reference.
- Promoting over a production version first replays stored rows (the production decision log imported
  as a run, or an evaluation on a labeled set) through both policies: the drift report (app/core/drift.py)
  and the share of decisions that change; beyond the tolerance it needs `confirm`.

Every failure is a RegistryError whose message names the fix; a registration that fails part-way is
undone (no registered model, version or alias left half-made).
"""
from __future__ import annotations

import json
import re
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from adapter.policy import CalibratedPolicy, PolicyError, load_policy
from deploy.config import DeployConfig, FormErrors, config_from_form
from deploy.package import build_package
from deploy.plan import Package, Step, deployment_plan, production_variant, upload_step
from deploy.validate import validate_plan

from app.core import deployed, tracking
from app.core import drift as dr
from app.core.store import Store, now
from app.core.stored import NO_RESPONSE, StoredResponse
from app.service import tracking as tracked
from app.service.display import Escape, Note, plain
from app.settings import WorkbenchSettings

if TYPE_CHECKING:
    from mlflow import MlflowClient

PREFIX = "semif-"
CANDIDATE, PRODUCTION = "candidate", "production"
HISTORY_TAG = "semif.production_history"
REFERENCE = re.compile(r"^models:/(?P<name>[^/@\s]+)(?:@(?P<alias>[A-Za-z0-9_-]+)|/(?P<version>[0-9]+))/?$")
DEFAULT_TOLERANCE = 0.05  # a candidate that decides differently on more than 5% of replayed rows asks first


class RegistryError(ValueError):
    """A registry action refused or failed, with what to do; nothing was left half-done."""


class NeedsConfirmation(RegistryError):
    """The shadow check found the candidate deciding differently beyond the tolerance (or had nothing to replay)."""

    def __init__(self, message: str, shadow: Shadow | None):
        super().__init__(message)
        self.shadow = shadow


def model_name(policy_id: str) -> str:
    return PREFIX + policy_id


def is_reference(text: str) -> bool:
    return str(text).strip().startswith("models:/")


def _uri() -> str:
    uri = tracked.uri()
    if uri is None:
        raise RegistryError("the policy registry is MLflow's: set SEMIF_MLFLOW_TRACKING_URI (`embedded` for a sqlite "
                            "file beside the workbench DB, or your tracking server's URI / SageMaker MLflow ARN)")
    return uri


def _client(uri: str) -> MlflowClient:
    try:
        return tracking.client(uri)
    except tracking.TrackerError as exc:
        raise RegistryError(str(exc)) from None


def _fail(what: str, uri: str, exc: BaseException) -> RegistryError:
    first = (str(exc).splitlines() or [""])[0][:300]
    return RegistryError(f"{what}: the MLflow tracker {uri} refused or could not be reached ({type(exc).__name__}: "
                         f"{first}) - check SEMIF_MLFLOW_TRACKING_URI and that the tracker is up")


def _missing(exc: BaseException) -> bool:
    return getattr(exc, "error_code", "") == "RESOURCE_DOES_NOT_EXIST"


# -- the one resolver ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Resolved:
    """A registry reference read into a plain, validated policy file."""
    ref: str
    name: str
    version: str
    alias: str | None
    path: Path
    policy: CalibratedPolicy


def policies_dir(store: Store | None = None) -> Path:
    db = store.path if store is not None else Path(WorkbenchSettings.from_env().db)
    return db.resolve().parent / "mlflow-policies"


def resolve(ref: str, *, store: Store | None = None, into: Path | None = None, model_sha256: str | None = None,
            model_file: str | None = None) -> Resolved:
    """`models:/NAME@ALIAS` or `models:/NAME/VERSION` -> the version's policy as a validated file (load_policy,
    with `model_sha256` also that it was calibrated on that model). RegistryError naming what is wrong."""
    text = str(ref).strip()
    m = REFERENCE.match(text)
    if m is None:
        raise RegistryError(f"{text!r} is not a registry reference: write models:/NAME@ALIAS (e.g. "
                            f"models:/{PREFIX}ticket-routing@production) or models:/NAME/VERSION")
    name, alias, version = m["name"], m["alias"], m["version"]
    uri = _uri()
    c = _client(uri)
    try:
        mv = c.get_model_version_by_alias(name, alias) if alias else c.get_model_version(name, str(version))
    except Exception as exc:  # noqa: BLE001 - MlflowException for a missing name/alias/version, or the network
        if _missing(exc) or "not found" in str(exc).lower() or "alias" in str(exc).lower():
            known = _known(c, name)
            raise RegistryError(f"{text}: no such {'alias' if alias else 'version'} in the registry at {uri}"
                                + (f" - {name} has {known}" if known else f" - no registered model {name}")) from None
        raise _fail(text, uri, exc) from None
    folder = into or policies_dir(store)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{name}.v{mv.version}.policy.json"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            got = _download(c, mv, tmp)
        except Exception as exc:  # noqa: BLE001
            raise _fail(f"{text} (version {mv.version}): downloading its policy file", uri, exc) from None
        found = got / "policy.json" if got.is_dir() else got
        if not found.is_file():
            raise RegistryError(f"{text} (version {mv.version}) holds no policy.json: it was not registered by the "
                                "workbench - register a calibrated policy with `python -m app registry register`")
        try:
            policy = load_policy(found, model_sha256=model_sha256, model_file=model_file,
                                 what=f"{text} (version {mv.version})")
        except PolicyError as exc:
            raise RegistryError(str(exc)) from None
        shutil.copyfile(found, target)
    return Resolved(text, name, str(mv.version), alias, target, policy)


def _download(c: MlflowClient, mv: Any, into: str) -> Path:
    """A version's files: a workbench version's source is `runs:/<run>/policy` (read through this client, so
    the same tracker); any other source through its download URI."""
    source = str(mv.source or "")
    if source.startswith("runs:/"):
        run_id, _, path = source[len("runs:/"):].partition("/")
        return Path(c.download_artifacts(run_id, path or "", into))
    import mlflow.artifacts  # noqa: PLC0415 - mlflow only with a tracker set (tracking.client imported it)

    return Path(mlflow.artifacts.download_artifacts(
        artifact_uri=c.get_model_version_download_uri(mv.name, mv.version), dst_path=into))


def resolve_path(ref: str, *, store: Store | None = None) -> str:
    """A policy argument as a file path: a registry reference resolved (resolve), anything else as given."""
    return str(resolve(ref, store=store).path) if is_reference(ref) else ref


def _known(c: MlflowClient, name: str) -> str:
    try:
        model = c.get_registered_model(name)
        versions = [str(v.version) for v in c.search_model_versions(f"name = '{name}'")]
    except Exception:  # noqa: BLE001
        return ""
    aliases = ", ".join(f"@{a} -> v{v}" for a, v in sorted(model.aliases.items())) or "no aliases"
    return f"versions {', '.join(sorted(versions, key=int)) or 'none'} ({aliases})"


# -- register ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Registered:
    name: str
    version: str
    new: bool  # False: this calibrated policy was registered before (the same file): its version again
    run_id: str


def config_of(store: Store, source: str | int | Mapping[str, Any]) -> tuple[dict[str, Any], int | None]:
    """A calibrated policy by saved id (3, '#3'), by file, or as its config; (config, saved id or None)."""
    if isinstance(source, Mapping):
        return dict(source), None
    text = str(source).strip()
    if text.lstrip("#").isdigit():
        rid = int(text.lstrip("#"))
        records = {int(r["id"]): r for r in store.list_calibrated()}
        if rid not in records:
            raise RegistryError(f"no saved calibrated policy #{rid} (saved: "
                                f"{', '.join(f'#{i}' for i in records) or 'none - save one on Calibrate'})")
        return dict(records[rid]["config"]), rid
    try:
        return load_policy(Path(text), what=text).model_dump(mode="json"), None
    except PolicyError as exc:
        raise RegistryError(str(exc)) from None


def register(store: Store, source: str | int | Mapping[str, Any], *, who: str | None = None) -> Registered:
    """Put a calibrated policy into the registry as a new version of `semif-<policy id>`, aliased `candidate`.
    Validated first (load_policy); a name held by another policy id is refused; a failure part-way undoes
    what was made."""
    config, saved = config_of(store, source)
    try:
        policy = load_policy(config, what="calibrated policy")
    except PolicyError as exc:
        raise RegistryError(f"{exc} - nothing registered") from None
    config = policy.model_dump(mode="json")
    sha = tracked.policy_sha(config)
    name, uri = model_name(policy.policy_id), _uri()
    c = _client(uri)
    try:
        existing = c.get_registered_model(name)
    except Exception as exc:  # noqa: BLE001
        if not _missing(exc):
            raise _fail(f"register {name}", uri, exc) from None
        existing = None
    if existing is not None:
        owner = existing.tags.get("semif.policy_id")
        if owner != policy.policy_id:
            raise RegistryError(f"registered model {name} exists in {uri} for "
                                f"{'policy ' + repr(owner) if owner else 'something other than a workbench policy'}, "
                                f"not for policy {policy.policy_id!r}: rename or delete it there - nothing registered")
        for v in c.search_model_versions(f"name = '{name}'"):
            if v.tags.get("semif.policy_sha256") == sha:
                c.set_registered_model_alias(name, CANDIDATE, v.version)
                return Registered(name, str(v.version), False, v.run_id or "")
    made_model = made_run = None
    version = None
    try:
        record = tracked.calibration_record(store, config, saved) or _bare_record(config)
        exp = tracking.experiment_id(c, uri, record["experiment"])
        run = c.create_run(exp, run_name=f"register · {name}", tags={**record["tags"], "semif.kind": "registry"})
        made_run = run.info.run_id
        for path in ("policy/policy.json", "policy/model.json"):
            c.log_text(made_run, record["artifacts"].get(path) or json.dumps(config["model"], indent=2), path)
        c.set_terminated(made_run)
        if existing is None:
            c.create_registered_model(name, tags={"semif.policy_id": policy.policy_id, HISTORY_TAG: "[]"},
                                      description=f"Calibrated policies of the workbench policy {policy.policy_id!r} "
                                                  "(semif-policy/1 files with their model identity).")
            made_model = name
        version = c.create_model_version(
            name, source=f"runs:/{made_run}/policy", run_id=made_run,
            tags={"semif.policy_sha256": sha, "semif.model_sha256": policy.model.sha256,
                  "semif.model_file": policy.model.file, "semif.calibrated_id": str(saved or ""),
                  "semif.registered_at": now()},
            description=f"{policy.model.file} · gate {policy.threshold} · fallback {policy.fallback_option}")
        c.set_registered_model_alias(name, CANDIDATE, version.version)
    except Exception as exc:  # noqa: BLE001 - undo, then say what failed
        _undo(c, name, made_model, version.version if version is not None else None, made_run)
        raise _fail(f"register {name} (undone: nothing registered)", uri, exc) from None
    store.audit(f"registry:{name}", "register", f"version {version.version} (policy {sha[:12]}, "
                f"{'calibrated #' + str(saved) if saved else 'file'})", "ok", who=who)
    return Registered(name, str(version.version), True, made_run)


def _bare_record(config: Mapping[str, Any]) -> tracking.Tracked:
    """A policy file without its workbench run: the artifacts and tags only."""
    return tracking.Tracked(kind="registry", workbench_id=f"policy {config['policy_id']}",
                            experiment=tracking.experiment_name(config["policy_id"]), run_name="register",
                            params={}, metrics={}, tags={"semif.policy_id": config["policy_id"]}, dataset=None,
                            artifacts={"policy/policy.json": json.dumps(config, indent=2, ensure_ascii=False) + "\n",
                                       "policy/model.json": json.dumps(config["model"], indent=2) + "\n"})


def _undo(c: MlflowClient, name: str, model: str | None, version: str | None, run: str | None) -> None:
    for step in ((lambda: c.delete_registered_model(name)) if model else
                 (lambda: c.delete_model_version(name, version)) if version else None,
                 (lambda: c.delete_run(run)) if run else None):
        if step is not None:
            try:
                step()
            except Exception:  # noqa: BLE001 - best effort; the first error is reported
                pass


# -- the shadow check ----------------------------------------------------------------------------------
@dataclass
class Shadow:
    """Production and candidate replayed on the same stored rows."""
    run_id: int
    rows: int
    changed: int  # rows whose decision (an option or the fallback) differs
    unread: int  # rows the candidate cannot read (scored by another model, no hidden state): not a replay
    drift: dr.Drift
    tolerance: float
    examples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.changed / self.rows if self.rows else 0.0

    @property
    def within(self) -> bool:
        return self.rows > 0 and not self.unread and self.rate <= self.tolerance

    def text(self) -> str:
        unread = (f"; {self.unread} of them cannot be replayed for the candidate (scored by another model than "
                  "its, or without the hidden state its head reads) - replay by scoring instead: python -m app check "
                  "--policy models:/NAME@candidate" if self.unread else "")
        return (f"replayed run #{self.run_id}: {self.changed} of {self.rows} decisions change ({self.rate:.1%}, "
                f"tolerance {self.tolerance:.1%}); top option flips {self.drift.flips}, shifts "
                f"{self.drift.counts.get('shift', 0)}; {self.drift.sentence('production', 'candidate')}{unread}")


def replay_run(store: Store, policy_id: str, run_id: int | None = None) -> int | None:
    """The rows to replay: the given run, else the newest production decision log of this policy, else its
    newest evaluation on a labeled set."""
    if run_id is not None:
        if store.get_run(run_id) is None:
            raise RegistryError(f"--replay {run_id}: no such run (a run id from History)")
        return run_id
    for kind in ("production", "eval"):
        found = [r for r in store.list_runs(kind=kind) if r["policy_id"] == policy_id and r.get("done_rows")]
        if found:
            return int(found[0]["id"])
    return None


def shadow(store: Store, production: CalibratedPolicy, candidate: CalibratedPolicy, run_id: int, *,
           tolerance: float = DEFAULT_TOLERANCE) -> Shadow:
    """Both policies on a run's stored rows (CalibratedPolicy.apply through deployed.answer): the drift
    report on their calibrated probabilities, and the decisions that change."""
    rows_a: list[dict[str, Any]] = []
    rows_b: list[dict[str, Any]] = []
    changed = unread = 0
    examples: list[dict[str, Any]] = []
    for r in store.results(run_id):
        a, b = deployed.answer(production, r), deployed.answer(candidate, r)
        if a is None or b is None:
            continue
        base = {"row_key": r["row_key"], "state": r["state"], "label": r["label"], "option_ids": r["option_ids"]}
        rows_a.append({**base, "probabilities": a.probabilities, "top_option": a.option_id})
        rows_b.append({**base, "probabilities": b.probabilities, "top_option": b.option_id})
        scored_by = (StoredResponse.of(r) or NO_RESPONSE).model_sha256
        other = scored_by is not None and len({scored_by, candidate.model.sha256, production.model.sha256}) > 1
        unread += int(bool(b.unread) or other)  # a policy on another model's rows gates them all: no replay
        if a.option_id != b.option_id:
            changed += 1
            if len(examples) < 10:
                examples.append({"row": r["row_key"], "production": a.option_id, "candidate": b.option_id,
                                 "label": r["label"]})
    report = dr.compare(rows_a, rows_b, labels={"a": "production", "b": "candidate"})
    return Shadow(run_id, len(rows_a), changed, unread, report, tolerance, examples)


# -- promote, rollback, list -----------------------------------------------------------------------------
@dataclass
class Promotion:
    name: str
    version: str
    previous: str | None
    shadow: Shadow | None
    note: str = ""


def _version_policy(store: Store, name: str, version: str) -> CalibratedPolicy:
    """A version's policy through the resolver (the validator): one that fails it is never promoted."""
    return resolve(f"models:/{name}/{version}", store=store).policy


def _name(text: str) -> str:
    return text if text.startswith(PREFIX) else model_name(text)


def _registered(c: Any, name: str, uri: str, action: str, hint: str = "") -> Any:
    """The registered model `name`, or a RegistryError: missing (with `hint`), or the tracker failing."""
    try:
        return c.get_registered_model(name)
    except Exception as exc:  # noqa: BLE001
        if _missing(exc):
            raise RegistryError(f"no registered model {name} in {uri}{hint}") from None
        raise _fail(f"{action} {name}", uri, exc) from None


def promote(store: Store, name: str, *, version: str | None = None, replay: int | None = None,
            tolerance: float = DEFAULT_TOLERANCE, confirm: bool = False, who: str | None = None) -> Promotion:
    """Move `production` to `version` (default: the candidate). Over an existing production version the shadow
    check runs first; beyond the tolerance (or with nothing to replay) NeedsConfirmation unless `confirm`."""
    name, uri = _name(name), _uri()
    c = _client(uri)
    model = _registered(c, name, uri, "promote", ": register a calibrated policy first "
                        "(python -m app registry register --calibrated ID)")
    chosen = version or model.aliases.get(CANDIDATE)
    if chosen is None:
        raise RegistryError(f"{name} has no @{CANDIDATE}: register a calibrated policy, or give --version")
    chosen = str(chosen)
    candidate = _version_policy(store, name, chosen)  # the validator: a version that fails it is never promoted
    previous = model.aliases.get(PRODUCTION)
    previous = str(previous) if previous is not None else None
    report = None
    note = ""
    if previous is not None and previous != chosen:
        current = _version_policy(store, name, previous)
        if current.model.sha256 != candidate.model.sha256:
            note = (f"the candidate (v{chosen}) runs another model ({candidate.model.file}) than production "
                    f"(v{previous}, {current.model.file}): the endpoint must be redeployed with it")
        rid = replay_run(store, candidate.policy_id, replay)
        if rid is None:
            if not confirm:
                raise NeedsConfirmation(f"no stored rows of policy {candidate.policy_id!r} to replay (import the "
                                        "production decision log, or evaluate a labeled set): confirm to promote "
                                        "without a shadow check", None)
        else:
            report = shadow(store, current, candidate, rid, tolerance=tolerance)
            if not report.within and not confirm:
                raise NeedsConfirmation(f"shadow check: {report.text()} - beyond the tolerance: confirm to promote",
                                        report)
    elif previous == chosen:
        raise RegistryError(f"{name} v{chosen} is already @{PRODUCTION}")
    history = _history(model.tags) + [chosen]
    try:
        c.set_registered_model_alias(name, PRODUCTION, chosen)
        c.set_registered_model_tag(name, HISTORY_TAG, json.dumps(history))
        c.set_model_version_tag(name, chosen, "semif.promoted_at", now())
        if report is not None:
            c.set_model_version_tag(name, chosen, "semif.shadow_check", report.text()[:5000])
    except Exception as exc:  # noqa: BLE001
        raise _fail(f"promote {name} v{chosen}", uri, exc) from None
    store.audit(f"registry:{name}", "promote", f"v{previous or '-'} -> v{chosen}"
                + (f"; {report.text()}" if report else "; no shadow check (first production)" if previous is None
                   else "; confirmed without rows to replay"), "confirmed" if confirm else "ok", who=who)
    return Promotion(name, chosen, previous, report, note)


def _history(tags: Mapping[str, str]) -> list[str]:
    try:
        got = json.loads(tags.get(HISTORY_TAG) or "[]")
    except ValueError:
        return []
    return [str(v) for v in got] if isinstance(got, list) else []


def rollback(store: Store, name: str, *, who: str | None = None) -> Promotion:
    """Move `production` back to the version it held before the last promotion (the history tag)."""
    name, uri = _name(name), _uri()
    c = _client(uri)
    model = _registered(c, name, uri, "rollback")
    history = _history(model.tags)
    current = model.aliases.get(PRODUCTION)
    if current is None or len(history) < 2:
        raise RegistryError(f"{name} has no earlier production version to roll back to (history: "
                            f"{', '.join('v' + v for v in history) or 'none'})")
    back = history[-2]
    _version_policy(store, name, back)  # still a valid policy
    try:
        c.set_registered_model_alias(name, PRODUCTION, back)
        c.set_registered_model_tag(name, HISTORY_TAG, json.dumps(history[:-1]))
        c.set_model_version_tag(name, str(current), "semif.rolled_back_at", now())
    except Exception as exc:  # noqa: BLE001
        raise _fail(f"rollback {name}", uri, exc) from None
    store.audit(f"registry:{name}", "rollback", f"v{current} -> v{back}", "ok", who=who)
    return Promotion(name, back, str(current), None)


@dataclass(frozen=True)
class Entry:
    name: str
    policy_id: str
    version: str
    aliases: tuple[str, ...]
    model_file: str
    registered_at: str


def listing(name: str | None = None) -> list[Entry]:
    """Every version of the workbench's registered models (or of one), newest first, with their aliases."""
    uri = _uri()
    c = _client(uri)
    try:
        models = [c.get_registered_model(_name(name))] if name else [
            m for m in c.search_registered_models(max_results=1000) if "semif.policy_id" in m.tags]
    except Exception as exc:  # noqa: BLE001
        if _missing(exc):
            raise RegistryError(f"no registered model {_name(name or '')} in {uri}") from None
        raise _fail("list", uri, exc) from None
    out = []
    for m in models:
        by_version: dict[str, list[str]] = {}
        for alias, v in m.aliases.items():
            by_version.setdefault(str(v), []).append(alias)
        for v in sorted(c.search_model_versions(f"name = '{m.name}'"), key=lambda v: -int(v.version)):
            out.append(Entry(m.name, m.tags.get("semif.policy_id", ""), str(v.version),
                             tuple(sorted(by_version.get(str(v.version), []))), v.tags.get("semif.model_file", ""),
                             v.tags.get("semif.registered_at", "")))
    return out


def audit(store: Store, name: str) -> list[str]:
    """The workbench's audit lines of a registered model."""
    return [f"{e['at']} {e['who']} {e['action']}: {e['what']} ({e['result']})"
            for e in store.audit_log(f"registry:{_name(name)}")]


# -- the Calibrate page's Register --------------------------------------------------------------------------
def enabled() -> bool:
    """Whether a tracker is set (the page shows Register only then)."""
    return tracked.uri() is not None


def register_note(store: Store, config: Mapping[str, Any], esc: Escape = plain) -> Note:
    """Register the calibrated policy shown on Calibrate: what happened, in a sentence (an error names the fix)."""
    try:
        got = register(store, config)
    except RegistryError as exc:
        return Note("error", f"Not registered: {esc(exc)}")
    again = "" if got.new else " (this exact policy was registered before: the same version)"
    return Note("success", f"Registered as {esc(got.name)} version {got.version}, alias @{CANDIDATE}{again}. Deploy it "
                           f"by reference, `models:/{esc(got.name)}@{PRODUCTION}`, once promoted: "
                           f"`python -m app registry promote {esc(got.name)}` (the shadow check runs first).")


# -- the candidate as a SageMaker shadow variant (a dry-run plan) ----------------------------------------------
SHADOW_VARIANT = "candidate-shadow"


def with_shadow(steps: list[Step], cfg: DeployConfig, candidate: Package) -> list[Step]:
    """A deployment plan with the candidate as a shadow variant: its model.tar.gz under its own key, a second
    SageMaker model on the same image, and the endpoint config's ShadowProductionVariants (SageMaker copies
    the production requests to it and logs its answers; callers only ever get production's)."""
    key = candidate.key.replace("model.tar.gz", "candidate-model.tar.gz")
    shadow_model = f"{cfg.model_name}-shadow"[:63]
    made = next(s for s in steps if s.operation == "CreateModel")
    out: list[Step] = []
    for step in steps:
        if step.operation == "CreateEndpointConfig":
            container = {**made.params["PrimaryContainer"], "ModelDataUrl": f"s3://{cfg.bucket}/{key}"}
            out += [upload_step(cfg.bucket, key, candidate.sha256, candidate.model_file, "model",
                                "upload the candidate's model.tar.gz (its policy file inside)"),
                    Step("sagemaker", "CreateModel", {**made.params, "ModelName": shadow_model,
                                                      "PrimaryContainer": container},
                         "SageMaker model of the candidate policy (the shadow variant)")]
            variant = {**production_variant(cfg), "VariantName": SHADOW_VARIANT, "ModelName": shadow_model}
            step = Step(step.service, step.operation, {**step.params, "ShadowProductionVariants": [variant]},
                        step.description + " + the candidate as a shadow variant", step.action, step.extra)
        out.append(step)
    return out


def shadow_plan(store: Store, name: str, *, model: str, work_dir: Path) -> tuple[DeployConfig, list[Step], list[str]]:
    """The plan that deploys @production with @candidate as its shadow variant, packaged and validated offline
    (botocore's service model and deploy's rules; moto has no shadow variants, so this is a plan to read, not
    one the tests apply). (config, steps, problems)."""
    name = _name(name)
    prod = resolve(f"models:/{name}@{PRODUCTION}", store=store)
    cand = resolve(f"models:/{name}@{CANDIDATE}", store=store)
    if prod.version == cand.version:
        raise RegistryError(f"{name}: @{CANDIDATE} is @{PRODUCTION} (v{prod.version}): register a new candidate first")
    try:
        aws = WorkbenchSettings.from_env()
        cfg = config_from_form({"serving": "semif", "compute": "cpu", "model_path": model, "region": aws.region,
                                "bucket": aws.deploy_bucket or "", "role_arn": aws.sagemaker_role_arn or "",
                                "codebuild_role_arn": aws.codebuild_role_arn or "", "policy_path": str(prod.path)},
                               placeholders=True)
        pkg = build_package(cfg, work_dir)
        cand_pkg = build_package(replace(cfg, policy_path=str(cand.path)), work_dir / "candidate")
    except (FormErrors, ValueError, FileNotFoundError) as exc:
        raise RegistryError(f"shadow plan: {exc}") from None
    steps = with_shadow(deployment_plan(cfg, pkg), cfg, cand_pkg)
    return cfg, steps, validate_plan(steps, cfg.region, allow_account_placeholder=True, allow_form_placeholders=True)
