"""Deploying a calibrated policy: plan (the model packaged first, so the plan shown carries the real
checksums and is exactly what runs), apply, status, destroy - every plan and outcome recorded in the
store (deployments + audit log), a live endpoint saved as a target. The Deploy page and `python -m
app deploy` (deploy's own CLI with the store as its ledger) share these steps."""
from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from adapter.policy import AtGate, PolicyError, PolicyMetrics, load_policy
from adapter.engine.catalog import SHIPPED
from adapter.engine.models import resolve_model, shipped_by_sha256
from adapter.safe_path import file_name, inside
from deploy.autoscaling import decisions_per_second
from deploy.config import COMPUTES, DEFAULT_CPU_INSTANCE, DEFAULT_POOLS, SERVINGS, DeployConfig, FormErrors, config_from_form
from deploy.errors import DeployError
from deploy.executor import ApplyOutcome, Executor, StepDone
from deploy.local import LocalEndpoint, LocalRunner
from deploy.plan import Package, Step
from deploy.prepare import Prepared, prepare, revalidate
from deploy.pricing import cost_per_1000, first_choice, hint

from app.core import deployed
from app.core.analysis import warm_latencies
from app.service.sets import MEASURED_MIN
from app.core.deploy_records import StoreRecorder, apply_and_record, destroy_and_record, record_planned, record_result
from app.core.records import Calibrated, Deployment
from app.core.stats import interval_text
from app.core.store import Store
from app.service import registry
from app.service.evaluate import gate_flags
from app.settings import WorkbenchSettings

WORK = Path(tempfile.gettempdir()) / "semif-deploy"


def load_calibrated(data: bytes) -> dict[str, Any]:
    """An uploaded calibrated policy, validated; ValueError naming what is wrong."""
    try:  # the adapter's own validator: size before parsing, UTF-8, depth, NaN, the head's shape
        return load_policy(data, what="the uploaded policy").model_dump(mode="json")
    except PolicyError as exc:
        raise ValueError(str(exc)) from None
UNSETTLED = ("failed", "planned", "superseded")  # plans that never ran and attempts that failed
LOCAL = "running-local"  # a plan running in the local SemIf container (deploy/local.py)


def from_registry(store: Store, ref: str) -> dict[str, Any]:
    """A calibrated policy by registry reference (models:/NAME@ALIAS), resolved and validated (registry.resolve);
    ValueError naming what is wrong."""
    return registry.resolve(ref, store=store).policy.model_dump(mode="json")


def policy_file(config: dict[str, Any], tag: str | int) -> Path:
    """A calibrated policy written where packaging reads it (inside model.tar.gz it is what the
    adapter enforces)."""
    policy = load_policy(dict(config), what="the calibrated policy")  # PolicyError (ValueError) naming the field
    # the safe-path rule (never outside), and a name that fits 128 characters for any valid id (safe_path.file_name)
    path = inside(WORK / "policies", file_name(f"{policy.policy_id}-{tag}", ".policy.json"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2))
    return path


def model_for(requested: str, calibrated_sha256: str) -> str:
    """The GGUF to package: the one asked for (a path or a shipped name), else the model the policy
    was calibrated on when it is a shipped one - recognised by the sha256 the policy records, whatever
    its file was called - else '' (the default model)."""
    ref = requested.strip() or shipped_by_sha256(calibrated_sha256) or ""
    return str(resolve_model(ref).path) if ref in SHIPPED else ref


@dataclass(frozen=True)
class PlanState:
    """What the Deploy page keeps between reruns: the config and package a plan was made from, copies - on
    confirm the plan is made again from them (Planned.from_state), exactly what runs."""
    cfg: DeployConfig
    pkg: Package


@dataclass
class Planned:
    """A plan on screen: the config, the package it was made from, the steps and what is wrong."""
    cfg: DeployConfig
    pkg: Package
    steps: list[Step]
    errors: list[str]

    def to_state(self) -> PlanState:
        """What a page keeps between reruns (copies: applying a plan fills in its config's account id)."""
        return PlanState(DeployConfig.from_dict(self.cfg.to_dict()), replace(self.pkg))

    @classmethod
    def from_state(cls, state: PlanState) -> Planned:
        cfg, pkg = DeployConfig.from_dict(state.cfg.to_dict()), replace(state.pkg)
        p = revalidate(cfg, pkg)
        return cls(cfg, pkg, p.steps, p.errors)

    def plan_json(self) -> str:
        return json.dumps({"deployment_id": self.cfg.deployment_id, "config": self.cfg.to_dict(),
                           "steps": [s.to_dict() for s in self.steps]}, indent=2, default=str)

    def cost_lines(self) -> list[str]:
        """Cost per hour (the autoscaling range when it scales out) and per 1,000 decisions - the
        priority-1 type of a GPU pool, the same price Compare uses."""
        cfg = self.cfg
        line = f"Cost while running: {hint(cfg)}"
        if cfg.autoscaling and cfg.autoscaling.max_instances > cfg.instance_count:
            line += (f"; autoscaling runs {cfg.autoscaling.min_instances}-{cfg.autoscaling.max_instances} instances, so up "
                     f"to {cfg.autoscaling.max_instances / cfg.instance_count:g}x that when scaled out")
        lines = [line + " (on-demand list prices, us-east-1; a hint, not a quote)"]
        rate = decisions_per_second(cfg)
        itype = first_choice(cfg.compute, cfg.instance_type, cfg.pools) or cfg.instance_type
        if rate:
            usd, note = cost_per_1000(itype, rate)
            measured = bool((cfg.autoscaling and cfg.autoscaling.decisions_per_second) or cfg.decisions_per_second)
            lines.append(f"Cost per 1,000 decisions on {itype}: " + (f"~${usd:.4f}" if usd is not None else "unknown")
                         + f" at {rate:g} decisions/s per instance ("
                         + ("your measurement" if measured else "the instance family's default; measure yours with "
                            "python -m app bench and enter it above") + f"); {note}")
        return lines


def plan(store: Store, form: dict[str, Any], *, replaces: PlanState | None = None,
         work: Path = WORK, local: bool = False) -> Planned:
    """Validate the form (deploy.config.FormErrors names each field), package, plan, validate, and
    record the plan; a plan it replaces before it ran is recorded as superseded and its package (hundreds
    of MB) deleted. ValueError / OSError when the model cannot be packaged. `local`: a plan to run in
    the local container - no bucket or role needed (they stay placeholders, so it cannot run in AWS)."""
    cfg = config_from_form(form, placeholders=local)
    prepared: Prepared = prepare(cfg, work)
    if replaces is not None:
        old = Planned.from_state(replaces)
        if Path(old.pkg.model_file).parent != Path(prepared.pkg.model_file).parent:
            shutil.rmtree(Path(old.pkg.model_file).parent, ignore_errors=True)
        old_id = replaces.cfg.deployment_id
        if old_id != cfg.deployment_id:
            record_result(store, old_id, "plan", "superseded", f"replaced by the plan {cfg.deployment_id}")
    record_planned(store, cfg, [s.to_dict() for s in prepared.steps])
    return Planned(cfg, prepared.pkg, prepared.steps, prepared.errors)


def executor(region: str, *, endpoint_url: str | None, poll: float,
             on_event: Callable[[dict[str, Any]], None] | None = None) -> Executor:
    return Executor(region, endpoint_url=endpoint_url, poll_seconds=poll, on_event=on_event)


def apply(store: Store, planned: Planned, ex: Executor, *, runtime_url: str | None = None) -> ApplyOutcome:
    """Run exactly the plan shown; the outcome (or the failure, re-raised as DeployError) is recorded
    and a live endpoint becomes a target."""
    return apply_and_record(store, planned.cfg, ex, steps=planned.steps, pkg=planned.pkg, runtime_url=runtime_url)


def destroy(store: Store, endpoint: str, ex: Executor) -> list[StepDone]:
    return destroy_and_record(store, endpoint, ex)


def local_target_name(endpoint_name: str) -> str:
    """The target a local run is saved as (target names are at most 64 characters)."""
    return f"{endpoint_name[:57]}-local"


class LocalLedger(StoreRecorder):
    """The store's ledger, and for local runs: the running container becomes a SemIf target at its
    127.0.0.1 URL (Playground, Compare, Calibrate and Robustness then test the exact artifact), removed
    again when the container is destroyed."""

    def finished(self, deployment_id: str, action: str, status: str, detail: str) -> None:
        super().finished(deployment_id, action, status, detail)
        dep = self.store.get_deployment(deployment_id)
        if dep is None:
            return
        name = local_target_name(dep["endpoint_name"])
        if action == "apply-local" and status == LOCAL:
            self.store.save_target(name, "semif", {"url": json.loads(detail)["url"]})
        elif action == "destroy-local" and status == "deleted":
            self.store.delete_target(name)


def local_runner(on_event: Callable[[dict[str, Any]], None] | None = None, work: Path = WORK) -> LocalRunner:
    """Runs plans in the local SemIf image (SEMIF_IMAGE, default localhost/semif:dev) on podman."""
    return LocalRunner(work, on_event=on_event)


def run_local(store: Store, planned: Planned, runner: LocalRunner) -> LocalEndpoint:
    """Run the plan shown in the local container (deploy/local.py); recorded in Deployments with its
    audit entries, and saved as a SemIf target. DeployError (recorded) when it does not start."""
    return runner.apply(planned.cfg, planned.steps, recorder=LocalLedger(store))


def destroy_local(store: Store, endpoint: str, runner: LocalRunner) -> str:
    """Stop and remove a local run's container (SIGTERM, then 30 s); its target goes too."""
    return runner.destroy(endpoint, endpoint, recorder=LocalLedger(store))


def deployments(store: Store) -> tuple[list[Deployment], list[Deployment]]:
    """(deployments that ran, plans never run and failed attempts)."""
    deps = store.list_deployments()
    return [d for d in deps if d["status"] not in UNSETTLED], [d for d in deps if d["status"] in UNSETTLED]


def ledger(store: Store, runtime_url: str | None = None) -> StoreRecorder:
    """deploy's Ledger writing into the workbench store (`python -m app deploy`): the plan as run, the
    outcome, and a live endpoint (or a local run, `apply --local`) as a target (a SageMaker endpoint
    reached through `runtime_url` when given)."""
    return LocalLedger(store, runtime_url)


def calibrated(store: Store) -> dict[int, Calibrated]:
    """The saved calibrated policies by id, newest first: what a deployment can ship."""
    return {c["id"]: c for c in store.list_calibrated()}


def deployment_label(dep: Deployment) -> str:
    """'dep-1a2b · InService · refund-check v2': a deployment in the picker, with the policy version of the
    calibrated policy it shipped (read from the file it packaged; said when that file is gone)."""
    path = str((dep["config"] or {}).get("policy_path") or "")
    if not path:
        shipped = "no calibrated policy" if dep["path"] == "semif" else "raw model (chat completions)"
    else:
        try:
            config = json.loads(Path(path).read_text())
            version = config.get("policy_version")
            shipped = f"{config.get('policy_id')}" + (f" v{version}" if version is not None else "")
        except (OSError, ValueError, AttributeError):
            shipped = "its policy file is no longer on this machine"
    return f"{dep['id']} · {dep['status']} · {shipped}"


@dataclass(frozen=True)
class FormStart:
    """What the Deploy form starts with, and the choices it offers."""
    region: str
    bucket: str
    role_arn: str
    codebuild_role_arn: str
    serving: str
    compute: str
    servings: tuple[str, ...] = tuple(SERVINGS)
    computes: tuple[str, ...] = tuple(COMPUTES)
    cpu_instance: str = DEFAULT_CPU_INSTANCE
    pools: tuple[tuple[str, int], ...] = tuple((str(t), int(p)) for t, p in DEFAULT_POOLS)


def form_defaults(store: Store, cfg: WorkbenchSettings) -> FormStart:
    """What the Deploy form starts with: the environment's values, else those of the newest recorded plan
    (a reload or a new session keeps the serving path, compute, bucket, roles and region of the last plan)."""
    deps = store.list_deployments()
    last = (deps[0].get("config") or {}) if deps else {}
    serving = last.get("serving") or last.get("path")  # records older than the rename say "path"
    from_env = "region" in cfg.model_fields_set  # AWS_DEFAULT_REGION given: it wins over the last plan's
    return FormStart(region=cfg.region if from_env or not last.get("region") else str(last["region"]),
                     bucket=cfg.deploy_bucket or str(last.get("bucket") or ""),
                     role_arn=cfg.sagemaker_role_arn or str(last.get("role_arn") or ""),
                     codebuild_role_arn=cfg.codebuild_role_arn or str(last.get("codebuild_role_arn") or ""),
                     serving=str(serving) if serving in SERVINGS else "semif",
                     compute=str(last.get("compute")) if last.get("compute") in COMPUTES else COMPUTES[0])


def calibrated_label(rec: Mapping[str, Any]) -> str:
    """How a saved calibrated policy is offered: its gate, and the accuracy of what it decides with n
    and the interval (a figure on a handful of rows says so)."""
    config = rec.get("config") or {}
    metrics = PolicyMetrics.stored(config.get("metrics"))
    at, held_out = metrics.at_gate or AtGate(), metrics.at_gate_out_of_fold  # out of fold: beside a hand-set gate
    if held_out is not None and "accuracy_interval" in held_out.model_fields_set:
        acc = interval_text(held_out.accuracy_interval, 0) + " out of fold"  # the in-sample figure is not held out
        cov = f"{held_out.decided}/{held_out.n} rows decided"
    elif "accuracy_interval" in at.model_fields_set:
        acc = interval_text(at.accuracy_interval, 0) + (" in sample" if at.in_sample else "")
        cov = f"{at.decided}/{at.n} rows decided"
    else:  # saved before intervals were recorded
        acc = "n/a" if rec.get("accuracy") is None else f"{rec['accuracy']:.0%} (n not recorded)"
        cov = f"coverage {rec.get('coverage') or 0:.0%}"
    warn = " · ⚠ no better than chance" if "no-better-than-chance" in gate_flags(
        at, len(config.get("options") or [0, 0]), config.get("target_accuracy")) else ""
    gate = rec.get("threshold")
    gate_text = f"gate {gate:.3f} ({rec['gate_source']})" if isinstance(gate, (int, float)) else "no global gate"
    version = f" v{config['policy_version']}" if config.get("policy_version") is not None else ""
    return (f"#{rec['id']} {rec['name']}{version} · {gate_text} · accuracy {acc} · {cov}{warn} · "
            f"{str(rec['created_at'])[:16]}")


def newer_version(store: Store, rec: Mapping[str, Any]) -> str | None:
    """When the policy of a saved calibrated policy has been saved again since: which version is current, whether
    it was evaluated and calibrated, and whether a check (Robustness) of a calibrated policy of it exists; None
    when this calibrated policy is of the current version (or either version is unknown)."""
    config = rec.get("config") or {}
    mine, pid = config.get("policy_version"), rec.get("policy_id")
    policy = store.get_policy(str(pid)) if pid else None
    now = (policy or {}).get("version")
    if not isinstance(mine, int) or not isinstance(now, int) or now <= mine:
        return None
    newer = [c for c in store.list_calibrated() if c.get("policy_id") == pid
             and ((c.get("config") or {}).get("policy_version") or 0) == now]
    evaluated = any(r.get("policy_id") == pid and (r.get("policy") or {}).get("version") == now
                    for r in store.list_runs(kind="eval"))
    tested = {((r.get("config") or {}).get("calibrated") or {}).get("sha256") for r in store.list_runs(kind="robustness")
              if r["status"] in ("done", "done-with-errors")}
    checked = [c["id"] for c in newer if deployed.content_hash(c["config"]) in tested]
    if newer:
        state = (f"calibrated as #{', #'.join(str(c['id']) for c in newer)}, "
                 + (f"checked (Robustness) as #{', #'.join(map(str, checked))}" if checked else "not checked yet (Robustness)"))
    else:
        state = "evaluated but not calibrated yet" if evaluated else "not evaluated or calibrated yet"
    return (f"{policy.get('name') if policy else pid} is now at v{now}; this calibrated policy is v{mine}. v{now}: {state}. "
            f"Shipping this one ships v{mine}.")


def rate_prefill(current: str, filled: tuple[int, str] | None, choice: int, rate: float | None
                 ) -> tuple[str, tuple[int, str] | None]:
    """(the decisions/s field's value, what is now pre-filled and for which pick): the pace measured for the
    calibrated policy picked (empty: the instance family's default), unless the analyst typed a value - a value
    that is the pre-fill of another pick was not typed, and follows the pick.

    >>> rate_prefill("", None, 3, 0.8)
    ('0.8', (3, '0.8'))
    >>> rate_prefill("0.8", (3, '0.8'), 4, 2.5)  # another calibrated policy picked: its own pace
    ('2.5', (4, '2.5'))
    >>> rate_prefill("0.8", (3, '0.8'), 5, None)  # nothing measured for it: the family default again
    ('', None)
    >>> rate_prefill("7", (3, '0.8'), 4, 2.5)  # typed: kept
    ('7', (3, '0.8'))
    """
    if current.strip() and (filled is None or current != filled[1]):
        return current, filled
    mine = f"{rate:.3g}" if rate is not None else ""
    return mine, ((choice, mine) if mine else None)


def measured_rate(store: Store, config: Mapping[str, Any]) -> tuple[float, str] | None:
    """(decisions/s, where from) measured on Calibrate for a calibrated policy: the warm pace of the target its
    run was scored on, in its layout (sets.pace) - on this machine's CPU, not the instance's; None before
    MEASURED_MIN warm calls (Deploy then says it uses the instance family's default)."""
    run = store.get_run(int(config["run_id"])) if config.get("run_id") else None
    if run is None:
        return None
    head = (config.get("layout") or "") == "policy-first"
    got = warm_latencies(store, {run["target_name"]}, head_layout=head).get(run["target_name"])
    if not got or got["n"] < MEASURED_MIN:
        return None
    seconds = got["p50_ms"] / 1000
    return 1 / seconds, (f"measured on Calibrate: the median of the last {got['n']} warm calls on "
                         f"{run['target_name']} ({seconds:.2g} s a row, on this machine's CPU - not the instance's)")
