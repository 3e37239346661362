"""Each workbench action as an MLflow run, when SEMIF_MLFLOW_TRACKING_URI is set (app/core/tracking.py
keeps and sends it). The service functions call one of these at their end - one line each:

- evaluation(store, run_id)               an evaluation run on a labeled set
- calibration(store, config, saved=None)  a calibrated policy exported (CLI) or saved (Calibrate page)
- comparison_group(store, group_id)      a Compare run or `app bench`, one MLflow run per target
- robustness(store, run_id, report)       a robustness check
- check(store, run_id, verdict)           `python -m app check`

With the setting off each returns None at once and mlflow is never imported. Nothing here raises: a
record that cannot be built or sent is a warning, and the action's own result stands.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import asdict, is_dataclass
from statistics import mean
from typing import Any, Callable, Mapping, Sequence

from adapter.env_settings import SettingsError
from adapter.policy import PolicyMetrics

from app.core import tracking
from app.core.check import CheckReport
from app.core.costs import instance_price
from app.core.records import Run, config_of
from app.core.stats import proportion
from app.core.store import Store
from app.core.stored import StoredResponse
from app.core.tracking import DatasetRef, Sent, Tracked, Where
from app.settings import WorkbenchSettings
from deploy.pricing import usd_per_1000

log = logging.getLogger("semif.tracking")


def uri() -> str | None:
    """The tracker this process logs to, None when tracking is off (or its setting is bad: said at start)."""
    try:
        return tracking.tracking_uri(WorkbenchSettings.from_env())
    except SettingsError:
        return None


def _log(store: Store, build: Callable[[], Tracked | None]) -> Sent | None:
    where = uri()
    if where is None:
        return None
    try:
        record = build()
        return None if record is None else tracking.track(store, where, record)
    except Exception as exc:  # noqa: BLE001 - tracking never breaks the action it records
        log.warning("MLflow: this action was not logged (%s: %s)", type(exc).__name__, exc)
        return None


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _flat(prefix: str, value: Any, out: dict[str, float]) -> None:
    """Numbers of a nested mapping as metrics `prefix.key` ([low, high] lists as .low/.high)."""
    if (n := _num(value)) is not None:
        out[prefix] = n
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, (list, tuple)) and len(value) == 2 and all(_num(v) is not None for v in value):
        out[f"{prefix}.low"], out[f"{prefix}.high"] = float(value[0]), float(value[1])


def dataset_of(store: Store, set_id: int | None) -> DatasetRef | None:
    labeled = store.get_labeled_set(set_id) if set_id is not None else None
    if labeled is None:
        return None
    return DatasetRef(name=f"{labeled['name']} (set #{labeled['id']})", content_hash=str(labeled["content_hash"]),
                      rows=int(labeled["n_rows"]), set_id=int(labeled["id"]))


def results_jsonl(results: Sequence[Mapping[str, Any]]) -> str:
    """Per-row results as JSON lines: key, label, top option, probabilities, seconds, error."""
    keep = ("row_key", "label", "top_option", "option_ids", "probabilities", "latency_s", "error")
    return "".join(json.dumps({k: r.get(k) for k in keep}, ensure_ascii=False) + "\n" for r in results)


def run_base(store: Store, run: Run, kind: str, *, run_name: str | None = None) -> Tracked:
    """What every run-backed record carries: params (target, model, readout, layout, correction, prompt),
    accuracy with its interval, seconds and tokens a row, $ per 1,000 where the target has a price, the
    labeled set as a dataset, per-row results as an artifact, tags back to the workbench."""
    results = store.results(run["id"])
    cfg = config_of(run)
    first = next((s for r in results if (s := StoredResponse.of(r)) is not None and s.model is not None), None)
    params = {"target": run["target_name"], "target_kind": str(run["target"].get("kind", "")),
              "policy_id": run["policy_id"], "policy_version": str(run["policy"].get("version", "")),
              "model_file": (first.model_file if first else None) or run.get("model") or "",
              "model_sha256": (first.model_sha256 if first else None) or "",
              "readout": cfg.get("readout") or (first.readout if first else None) or "",
              "layout": cfg.get("layout") or "state-first", "correction": cfg.get("debias") or
              (first.debias if first else None) or "none", "permute": str(bool(cfg.get("permute"))),
              "prompt_version": (first.prompt_version if first else None) or ""}
    answered = [r for r in results if not r.get("error") and r.get("probabilities")]
    labeled = [r for r in answered if r.get("label") is not None]
    metrics: dict[str, float] = {"rows": float(len(results)), "errors": float(len(results) - len(answered))}
    if labeled:
        acc = proportion(sum(r["top_option"] == r["label"] for r in labeled), len(labeled))
        metrics["accuracy"] = float(acc.rate or 0.0)
        if acc.low is not None and acc.high is not None:
            metrics["accuracy.ci_low"], metrics["accuracy.ci_high"] = float(acc.low), float(acc.high)
    seconds = [float(r["latency_s"]) for r in answered if _num(r.get("latency_s")) is not None]
    if seconds:
        metrics["seconds_a_row"] = mean(seconds)
        hourly, _ = instance_price(run["target"], store)
        if hourly:
            metrics["usd_per_1000"] = usd_per_1000(hourly, 1 / max(metrics["seconds_a_row"], 1e-9))
    tokens = [t for r in answered if (t := _num((r.get("response") or {}).get("input_tokens")
                                                if isinstance(r.get("response"), dict) else None)) is not None]
    if tokens:
        metrics["tokens_a_row"] = mean(tokens)
    tags = {"semif.run_id": str(run["id"]), "semif.run_kind": run["kind"], "semif.policy_id": run["policy_id"],
            "semif.db": str(store.path)}
    return Tracked(kind=kind, workbench_id=f"run #{run['id']}", experiment=tracking.experiment_name(run["policy_id"]),
                   run_name=run_name or f"{kind} · run #{run['id']} · {run['target_name']}", params=params,
                   metrics=metrics, tags=tags, dataset=dataset_of(store, run.get("labeled_set_id")),
                   artifacts={"results.jsonl": results_jsonl(results)})


def evaluation(store: Store, run_id: int | None) -> Sent | None:
    """An evaluation run (the rows scored so far) as an MLflow run."""
    def build() -> Tracked | None:
        run = store.get_run(run_id) if run_id is not None else None
        return None if run is None else run_base(store, run, "evaluation")
    return _log(store, build)


def calibration_record(store: Store, config: Mapping[str, Any], saved: int | None = None) -> Tracked | None:
    """A calibrated policy (the exported file) with the run it was measured on: the gate rule, the head, the
    calibration's metrics and their intervals, the policy JSON as an artifact."""
    run = store.get_run(int(config["run_id"])) if config.get("run_id") is not None else None
    if run is None:
        return None
    where = f"calibrated #{saved}" if saved is not None else f"run #{run['id']}"
    rec = run_base(store, run, "calibration", run_name=f"calibration · {config['policy_id']} · {where}")
    head = config.get("head") or {}
    metrics = PolicyMetrics.stored(config.get("metrics"))
    chosen = metrics.correction.chosen if metrics.correction is not None else ""
    rec["params"].update({
        "model_file": config["model"]["file"], "model_sha256": config["model"]["sha256"],
        "readout": str(config.get("readout")), "layout": str(config.get("layout")),
        "correction": f"{config.get('debias')} + {chosen or 'temperature'}",
        "head_kind": str(head.get("kind") or "none"), "prompt_version": str(config.get("prompt_version")),
        "gate_rule": (f"confidence >= {config['threshold']:.4f} ({config.get('gate_source')})"
                      if config.get("threshold") is not None else "none") + f", else {config.get('fallback_option')}",
        "target_accuracy": str(config.get("target_accuracy")), "policy_version": str(config.get("policy_version"))})
    figures = {"accuracy": metrics.accuracy, "macro_f1": metrics.macro_f1, "brier": metrics.brier, "nll": metrics.nll,
               "ece_width": metrics.ece_width, "ece_mass": metrics.ece_mass, "temperature": metrics.temperature,
               "oof_accuracy": metrics.oof_accuracy, "oof_brier": metrics.oof_brier, "oof_nll": metrics.oof_nll,
               "oof_ece_width": metrics.oof_ece_width, "oof_ece_mass": metrics.oof_ece_mass}
    for key, value in figures.items():
        if (n := _num(value)) is not None:
            rec["metrics"][key] = n
    if "ece_width" in rec["metrics"]:
        rec["metrics"]["ece"] = rec["metrics"]["ece_width"]
    if (iv := metrics.intervals) is not None:  # [low, high], or a proportion's low/high
        _flat("interval.n", iv.n, rec["metrics"])
        _flat("interval.accuracy", {"low": iv.accuracy.low, "high": iv.accuracy.high}, rec["metrics"])
        for key, ci in (("macro_f1", iv.macro_f1), ("ece", iv.ece), ("ece_corrected", iv.ece_corrected)):
            _flat(f"interval.{key}", ci, rec["metrics"])
    if (at := metrics.at_gate) is not None:
        for key, figure in (("coverage", at.coverage), ("accuracy", at.accuracy), ("decided", at.decided),
                            ("gated", at.gated)):
            if (n := _num(figure)) is not None:
                rec["metrics"][f"gate.{key}"] = n
        for key, p in (("accuracy_interval", at.accuracy_interval), ("coverage_interval", at.coverage_interval)):
            _flat(f"gate.{key}", {"low": p.low, "high": p.high}, rec["metrics"])
    if (n := _num(config.get("threshold"))) is not None:
        rec["metrics"]["gate.threshold"] = n
    rec["tags"]["semif.calibrated_id"] = str(saved) if saved is not None else ""
    rec["tags"]["semif.policy_sha256"] = policy_sha(config)
    rec["artifacts"]["policy/policy.json"] = json.dumps(config, indent=2, ensure_ascii=False) + "\n"
    rec["artifacts"]["policy/model.json"] = json.dumps(config["model"], indent=2) + "\n"
    if saved is not None:
        rec["workbench_id"] = f"calibrated #{saved}"
    return rec


def policy_sha(config: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def calibration(store: Store, config: Mapping[str, Any], saved: int | None = None) -> Sent | None:
    """A calibrated policy exported or saved, as an MLflow run in its policy's experiment."""
    return _log(store, lambda: calibration_record(store, config, saved))


def comparison_group(store: Store, group_id: str) -> list[Sent | None]:
    """A comparison (Compare page, `app bench`): each target's run of the group as an MLflow run, tagged with
    the group."""
    def build(run: Run) -> Tracked:
        rec = run_base(store, run, "comparison", run_name=f"comparison · {group_id[:8]} · {run['target_name']}")
        rec["tags"]["semif.group_id"] = group_id
        return rec
    return [_log(store, lambda r=r: build(r)) for r in store.runs_in_group(group_id)]  # type: ignore[misc]


def robustness(store: Store, run_id: int, report: Any) -> Sent | None:
    """A robustness check: held/moved rates from its report, the report JSON as an artifact."""
    def build() -> Tracked | None:
        run = store.get_run(run_id)
        if run is None:
            return None
        rec = run_base(store, run, "robustness")
        data = asdict(report) if is_dataclass(report) and not isinstance(report, type) else dict(report or {})
        _flat("robustness", {k: v for k, v in data.items() if not isinstance(v, list)}, rec["metrics"])
        rec["artifacts"]["robustness.json"] = json.dumps(data, indent=2, ensure_ascii=False, default=str)
        return rec
    return _log(store, build)


def check(store: Store, run_id: int, report: CheckReport) -> Sent | None:
    """`python -m app check`: each threshold's measured figure and bound, and the verdict (pass / fail)."""
    def build() -> Tracked | None:
        run = store.get_run(run_id)
        if run is None:
            return None
        rec = run_base(store, run, "check")
        for o in report.outcomes:
            if (n := _num(o.measured)) is not None:
                rec["metrics"][f"check.{o.name}"] = n
            rec["params"][f"bound.{o.name}"] = str(o.bound)
        rec["metrics"]["check.passed"] = float(report.passed)
        rec["tags"]["semif.check_passed"] = str(report.passed)
        rec["artifacts"]["check.json"] = json.dumps({"passed": report.passed, "outcomes": [asdict(o) for o in
                                                    report.outcomes], "context": report.context},
                                                    indent=2, ensure_ascii=False, default=str)
        return rec
    return _log(store, build)


def where(store: Store, workbench_id: str) -> list[Where]:
    """Where an action went in MLflow (History shows it)."""
    return tracking.where(store, workbench_id)


def sent_text(sent: Sent) -> str:
    """'run <id> (experiment <id>) at <uri>', or why it waits."""
    where = uri() or "?"
    if sent.waiting:
        return f"not reachable now ({sent.error}); kept in the workbench, sent with the next logged action"
    return tracking.run_link(where, sent.experiment_id, sent.mlflow_run_id)


def link(w: Where) -> str:
    return tracking.run_link(w["tracking_uri"], w["experiment_id"], w["mlflow_run_id"])


def flush(store: Store) -> tuple[int, int]:
    """Send what waits for the configured tracker: (sent now, still waiting)."""
    where = uri()
    if where is None:
        return 0, tracking.pending(store)
    sent = [s for s in tracking.flush(store, where) if not s.waiting]
    return len(sent), tracking.pending(store)
