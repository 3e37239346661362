"""The standalone deploy CLI's ledger: a JSON-lines audit file. deploy/ never imports the workbench;
`python -m app deploy` hands the CLI the workbench's SQLite ledger instead (app/core/deploy_records.py).

A ledger is a Recorder (deploy.executor) that can also find a deployment's resource names again, so
that `destroy` deletes what `apply` created even when the names were not derived from the endpoint."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Protocol

from .config import DeployConfig
from .executor import Recorder
from .plan import Step


class Ledger(Recorder, Protocol):
    def names(self, endpoint: str) -> tuple[str, str] | None:
        """(endpoint config, model) recorded for `endpoint`, or None when it was never recorded."""


class AuditFile:
    """Appends one JSON object per event: the plan as executed, then the outcome of apply/destroy."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def _append(self, entry: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **entry}) + "\n")

    def planned(self, cfg: DeployConfig, steps: list[Step]) -> None:
        self._append({"deployment_id": cfg.deployment_id, "action": "plan", "status": "ok",
                      "endpoint_name": cfg.endpoint_name, "endpoint_config_name": cfg.endpoint_config_name,
                      "model_name": cfg.model_name, "config": cfg.to_dict(), "plan": [s.to_dict() for s in steps]})

    def finished(self, deployment_id: str, action: str, status: str, detail: str) -> None:
        self._append({"deployment_id": deployment_id, "action": action, "status": status, "detail": detail})

    def entries(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip()]

    def names(self, endpoint: str) -> tuple[str, str] | None:
        plans = [e for e in self.entries() if e["action"] == "plan" and e.get("endpoint_name") == endpoint]
        return (plans[-1]["endpoint_config_name"], plans[-1]["model_name"]) if plans else None
