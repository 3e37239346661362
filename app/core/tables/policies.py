"""Policies (versioned: an edit names the version it was built on) and the calibrated policies exported
from them, kept with their provenance."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Collection, Mapping, cast

from app.core.records import Calibrated, Policy, Result, Run
from app.core.tables.base import Connection, _decode, _encode, now
from app.core.tables.runs import _run


class StaleEdit(RuntimeError):
    """An edit based on an older saved version of the same record (or of one deleted since)."""


@dataclass(frozen=True)
class CalibratedReads:
    """The calibrated policies saved (newest first) and, for the ones asked for, the evaluation run each was
    calibrated on with its results (the rows a head was fitted on): what `--calibrated` needs, in one trip."""
    saved: list[Calibrated]
    runs: dict[int, Run] = field(default_factory=dict)
    results: dict[int, list[Result]] = field(default_factory=dict)


class PolicyTable(Connection):
    """The policies and calibrated_policies tables."""

    # -- policies ----------------------------------------------------------------------------
    def list_policies(self) -> list[Policy]:
        with self.db() as db:
            return [cast(Policy, _decode(r)) for r in db.table("policies").rows_where(order_by="name")]

    def get_policy(self, policy_id: str) -> Policy | None:
        with self.db() as db:
            rows = list(db.table("policies").rows_where("id = ?", [policy_id]))
        return cast(Policy, _decode(rows[0])) if rows else None

    def save_policy(self, policy: Mapping[str, Any], expected_version: int | None = None) -> Policy:
        """Save and return the saved policy (with its new version). `expected_version` says what the
        editor's view was built on, and the write happens only if that is still so - checked and
        written by one statement, so of two saves from the same view exactly one wins:

        - None: whatever is saved (templates, a CLI import): insert, or update and bump the version
        - 0: a new policy - StaleEdit when one with this id exists (created meanwhile)
        - n: an edit of version n - StaleEdit when it was saved again since, or deleted
        """
        pid = policy["id"]
        fields = {"name": policy["name"], "question": policy["question"], "options": policy["options"],
                  "examples": policy.get("examples") or [], "notes": policy.get("notes") or "",
                  "readout": policy.get("readout") or "", "debias": policy.get("debias") or "",
                  "guard": policy.get("guard") or "", "updated_at": now()}
        values = _encode(fields)
        cols = list(values)
        insert = (f"INSERT INTO policies (id, {', '.join(cols)}, created_at, version) "
                  f"VALUES (?, {', '.join('?' * len(cols))}, ?, 1)")
        args = [pid, *values.values(), now()]
        with self.write() as db:
            if expected_version is None:
                db.execute(insert + " ON CONFLICT(id) DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in cols)
                           + ", version = coalesce(policies.version, 0) + 1", args)
            elif expected_version == 0:
                if db.execute(insert + " ON CONFLICT(id) DO NOTHING", args).rowcount != 1:
                    raise StaleEdit(f"a policy with id {pid!r} was created meanwhile (another page or session): "
                                    "nothing was saved - choose another name, or pick that policy to edit it")
            else:
                cur = db.execute(f"UPDATE policies SET {', '.join(f'{c} = ?' for c in cols)}, "
                                 "version = coalesce(version, 0) + 1 WHERE id = ? AND coalesce(version, 0) = ?",
                                 [*values.values(), pid, expected_version])
                if cur.rowcount != 1:
                    found = db.execute("SELECT version FROM policies WHERE id = ?", [pid]).fetchall()
                    if not found:
                        raise StaleEdit(f"policy {pid!r} was deleted (by another page or session) after this view "
                                        f"loaded version {expected_version}: nothing was saved - to keep this draft, "
                                        "save it as a new policy")
                    raise StaleEdit(f"policy {pid!r} was saved again (version {found[0][0]}) after this view loaded "
                                    f"version {expected_version}: nothing was saved - load the newer version, then "
                                    "apply your change")
            (row,) = list(db.table("policies").rows_where("id = ?", [pid]))
        return cast(Policy, _decode(row))

    def policy_or_saved(self, ref: str, candidate: Mapping[str, Any] | None) -> tuple[Policy | None, Policy | None]:
        """A --policy reference in one trip: (the policy saved under `ref`, None) when there is one; else (None,
        the saved policy with `candidate`'s id), `candidate` (a template or a file's policy, validated) saved first
        when no policy has that id - read only when it is there, so a read-only file still serves it; (None, None)
        with neither."""
        with self.db() as db:
            rows = list(db.table("policies").rows_where("id = ?", [ref]))
            if rows or candidate is None:
                return (cast(Policy, _decode(rows[0])) if rows else None), None
            rows = list(db.table("policies").rows_where("id = ?", [candidate["id"]]))
        if rows:
            return None, cast(Policy, _decode(rows[0]))
        try:
            return None, self.save_policy(candidate, expected_version=0)
        except StaleEdit:  # saved by someone else meanwhile: runs keep their own copy of the policy
            return None, self.get_policy(candidate["id"])

    def delete_policy(self, policy_id: str) -> None:
        with self.db() as db:
            db.table("policies").delete_where("id = ?", [policy_id])

    # -- calibrated policies (exports kept with their provenance, for the Deploy page) ---------------
    def save_calibrated(self, config: dict[str, Any]) -> int:
        at = (config.get("metrics") or {}).get("at_gate") or {}
        row = {"policy_id": config["policy_id"], "name": config.get("name") or config["policy_id"],
               "run_id": config.get("run_id"), "created_at": now(), "gate_source": config.get("gate_source"),
               "threshold": config.get("threshold"), "coverage": at.get("coverage"), "accuracy": at.get("accuracy"),
               "model_file": config["model"]["file"], "model_sha256": config["model"]["sha256"],
               "dataset_hash": (config.get("dataset") or {}).get("content_hash"), "config": config}
        with self.db() as db:
            return int(db.table("calibrated_policies").insert(_encode(row)).last_pk or 0)

    def list_calibrated(self) -> list[Calibrated]:
        with self.db() as db:
            return [cast(Calibrated, _decode(r)) for r in db.table("calibrated_policies").rows_where(order_by="id desc")]

    def calibrated_reads(self, ids: Collection[int], run_ids: Collection[int] = ()) -> CalibratedReads:
        """Every saved calibrated policy, and the run (with its results) that the ones in `ids` name as their
        `run_id`, and the runs in `run_ids` (a file's) - one connection."""
        with self.db() as db:
            saved = [cast(Calibrated, _decode(r)) for r in db.table("calibrated_policies").rows_where(order_by="id desc")]
            wanted = {int(r) for r in run_ids} | {int(c["config"]["run_id"]) for c in saved if c["id"] in set(ids)
                                                   and isinstance((c.get("config") or {}).get("run_id"), int)}
            runs: dict[int, Run] = {}
            results: dict[int, list[Result]] = {}
            for run_id in sorted(wanted):
                found = list(db.table("runs").rows_where("id = ?", [run_id]))
                if found:
                    runs[run_id] = cast(Run, _run(found[0]))
                    results[run_id] = [cast(Result, _decode(r)) for r in
                                       db.table("results").rows_where("run_id = ?", [run_id], order_by="position")]
        return CalibratedReads(saved, runs, results)
