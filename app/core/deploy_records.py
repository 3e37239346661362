"""A deployment's life in the workbench's SQLite: the record, the audit log, and the target that
lets the Playground and Compare pages call the new endpoint. Lives in app/ (not deploy/) so the
dependency points one way: app -> deploy. StoreRecorder is deploy's Ledger for the store; `python -m
app deploy ...` (app/cli/deploy.py) is deploy's CLI with this ledger instead of its audit file."""
from __future__ import annotations

from typing import Any

from deploy.config import DeployConfig
from deploy.executor import ApplyOutcome, Executor, StepDone
from deploy.plan import Package, Step

from app.core.store import Store


def record_planned(store: Store, cfg: DeployConfig, plan: list[dict[str, Any]], who: str | None = None,
                   when: str = "") -> None:
    store.save_deployment({"id": cfg.deployment_id, "path": cfg.serving, "compute": cfg.compute, "region": cfg.region,
                           "endpoint_name": cfg.endpoint_name, "model_name": cfg.model_name,
                           "endpoint_config_name": cfg.endpoint_config_name, "status": "planned",
                           "config": cfg.to_dict(), "plan": plan})
    store.audit(cfg.deployment_id, "plan", f"{when}{len(plan)} calls, {cfg.serving} on {cfg.compute} in {cfg.region}",
                "ok", who)


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
        # where its calls go (a test's shim) is the operator's setting, read at each use - never saved into a target
        cfg = {"endpoint_name": dep["endpoint_name"], "region": dep["region"], "protocol": protocol}
        store.save_target(dep["endpoint_name"], "sagemaker", cfg)
    if action == "destroy" and status == "deleted":
        store.delete_target(dep["endpoint_name"])


class StoreRecorder:
    """Writes what the executor reports: the executed plan before the first call, then the outcome."""

    def __init__(self, store: Store, runtime_url: str | None = None, who: str | None = None):
        self.store, self.runtime_url, self.who = store, runtime_url, who

    def planned(self, cfg: DeployConfig, steps: list[Step]) -> None:
        # the plan as it runs on confirm (the account id filled in): a second "plan" entry, said as such
        record_planned(self.store, cfg, [s.to_dict() for s in steps], self.who, when="as run on confirm: ")

    def finished(self, deployment_id: str, action: str, status: str, detail: str) -> None:
        record_result(self.store, deployment_id, action, status, detail, self.who,
                      endpoint_url=self.runtime_url if action == "apply" else None)

    def names(self, endpoint: str) -> tuple[str, str] | None:
        dep = self.store.get_deployment(endpoint)
        return (dep["endpoint_config_name"], dep["model_name"]) if dep else None


def apply_and_record(store: Store, cfg: DeployConfig, executor: Executor, steps: list[Step] | None = None,
                     pkg: Package | None = None, runtime_url: str | None = None) -> ApplyOutcome:
    """Run the confirmed plan; the store gets the plan as executed, the outcome and the new target.
    Re-raises DeployError after recording the failure, so the CLI and the Deploy page log alike."""
    return executor.apply(cfg, steps, pkg, recorder=StoreRecorder(store, runtime_url))


def destroy_and_record(store: Store, endpoint: str, executor: Executor) -> list[StepDone]:
    """Delete a deployment's scaling, endpoint, config and model (names from the record, else derived)."""
    ledger = StoreRecorder(store)
    config, model = ledger.names(endpoint) or (f"{endpoint}-config", f"{endpoint}-model")
    return executor.destroy(endpoint, config, model, recorder=ledger)
