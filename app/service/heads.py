"""Calibrated policies beyond Calibrate, as deployed (app/core/deployed.py): the saved ones of a policy, and
one by saved id or by file - for the Robustness check, Compare and `app bench` (a column per target), and a
pick that must carry a learned head. What they decide is CalibratedPolicy.apply's (app/core/deployed.py)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from app.core import deployed
from app.core.deployed import AsDeployed as AsDeployed
from app.core.deployed import HeadPick as HeadPick
from app.core.store import Store
from app.service import registry


def pick(store: Store, ref: str | int) -> HeadPick:
    """A calibrated policy with a head, by saved id (`3`, `#3`) or by file; ValueError naming what is wrong."""
    p = as_deployed(store, ref)
    return deployed.pick(p.config, id=p.id, source=p.source, fitted=p.fitted)


def calibrated_of(store: Store, policy_id: str) -> dict[int, str]:
    """Every saved calibrated policy of a policy (with a head or not), newest first: id -> label."""
    return {int(r["id"]): deployed.record_label(r) for r in store.list_calibrated()
            if r.get("policy_id") == policy_id}


def as_deployed(store: Store, ref: str | int) -> AsDeployed:
    """A saved calibrated policy (`3`, `#3`), a policy file or a registry reference (models:/NAME@ALIAS), as
    deployed; ValueError naming what is wrong."""
    return as_deployed_all(store, [ref])[0]


def as_deployed_all(store: Store, refs: Sequence[str | int]) -> list[AsDeployed]:
    """as_deployed for several references, reading the store once for all of them (the saved records, the runs
    their heads were fitted on); ValueError naming the first that is wrong."""
    found: list[tuple[int | None, dict[str, Any], str]] = []  # (saved id, config, file name)
    for ref in refs:
        text = str(ref).strip()
        if text.lstrip("#").isdigit():
            found.append((int(text.lstrip("#")), {}, ""))
            continue
        if registry.is_reference(text):  # models:/NAME@ALIAS: the registry's version as a validated file
            try:
                text = str(registry.resolve(text, store=store).path)
            except registry.RegistryError as exc:
                raise ValueError(f"calibrated: {exc}") from None
        path = Path(text)
        try:
            config = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"calibrated: cannot read {text} as a saved id or a policy file: {exc}") from None
        if not isinstance(config, dict):
            raise ValueError(f"calibrated: {text} is not a calibrated policy (a JSON object)")
        found.append((None, config, path.name))
    if not found:
        return []
    reads = store.calibrated_reads([rid for rid, _, _ in found if rid is not None],
                                   [c["run_id"] for rid, c, _ in found if rid is None and isinstance(c.get("run_id"), int)])
    records = {int(r["id"]): r for r in reads.saved}
    out: list[AsDeployed] = []
    for rid, config, source in found:
        if rid is not None:
            if rid not in records:
                known = ", ".join(f"#{i}" for i in records) or "none yet (save one on Calibrate)"
                raise ValueError(f"calibrated: no saved calibrated policy #{rid}; saved: {known}")
            config = records[rid]["config"]
        run_id = config.get("run_id")
        run = reads.runs.get(run_id) if isinstance(run_id, int) else None
        fitted = deployed.fitted_from(config, run, reads.results.get(run["id"], []) if run is not None else [])
        out.append(deployed.from_config(config, id=rid, fitted=fitted) if rid is not None else
                   deployed.from_config(config, source=source, fitted=fitted))
    return out
