"""A deployment's life in the workbench's SQLite: the record, the audit log, and the target that
lets the Playground and Compare pages call the new endpoint."""
from __future__ import annotations

import json

from app.store import Store

from .config import DeployConfig


def record_planned(store: Store, cfg: DeployConfig, plan: list[dict], who: str | None = None) -> None:
    store.save_deployment({"id": cfg.deployment_id, "path": cfg.path, "compute": cfg.compute, "region": cfg.region,
                           "endpoint_name": cfg.endpoint_name, "model_name": cfg.model_name,
                           "endpoint_config_name": cfg.endpoint_config_name, "status": "planned",
                           "config": cfg.to_dict(), "plan": plan})
    store.audit(cfg.deployment_id, "plan", f"{len(plan)} calls, {cfg.path} on {cfg.compute} in {cfg.region}", "ok", who)


def record_result(store: Store, dep_id: str, action: str, status: str, detail: str, who: str | None = None,
                  endpoint_url: str | None = None) -> None:
    dep = store.get_deployment(dep_id)
    if dep is None:
        return
    dep["status"] = status
    store.save_deployment(dep)
    store.audit(dep_id, action, detail, status, who)
    if action == "apply" and status == "InService":
        protocol = "semif" if dep["path"] == "semif" else "chat"
        cfg = {"endpoint_name": dep["endpoint_name"], "region": dep["region"], "protocol": protocol}
        if endpoint_url:
            cfg["endpoint_url"] = endpoint_url
        store.save_target(dep["endpoint_name"], "sagemaker", cfg)
    if action == "destroy" and status == "deleted":
        store.delete_target(dep["endpoint_name"])


def apply_and_record(store: Store, cfg: DeployConfig, calls: list[dict], executor, runtime_url: str | None = None) -> dict:
    """Record the plan, run it, record the outcome (and the new target). Re-raises DeployError
    after recording the failure, so the CLI and the Deploy page log the same way."""
    from .executor import DeployError

    record_planned(store, cfg, calls)
    try:
        outcome = executor.apply(cfg)
    except DeployError as exc:
        record_result(store, cfg.deployment_id, "apply", "failed", str(exc))
        raise
    record_result(store, cfg.deployment_id, "apply", outcome["status"]["status"],
                  json.dumps({"model_sha256": outcome["model_sha256"], "steps": outcome["steps"]}),
                  endpoint_url=runtime_url)
    return outcome


def destroy_and_record(store: Store, endpoint: str, executor) -> list[dict]:
    """Delete a deployment's endpoint, config and model (names from the record, else derived)."""
    from .executor import DeployError

    dep = store.get_deployment(endpoint)
    model = dep["model_name"] if dep else f"{endpoint}-model"
    config = dep["endpoint_config_name"] if dep else f"{endpoint}-config"
    try:
        done = executor.destroy(endpoint, config, model)
    except DeployError as exc:
        record_result(store, endpoint, "destroy", "destroy-failed", str(exc))
        raise
    record_result(store, endpoint, "destroy", "deleted", json.dumps(done))
    return done
