"""Read-only queries: what pages and commands read from the store as it is, one store call each. They exist for
one rule - pages never touch the store (tests/test_layout.py) - so they live together here instead of one beside
each action module; nothing here writes, and tests/test_layout.py checks that (READ_ONLY)."""
from __future__ import annotations

from app.core.records import AuditEntry, LabeledSet, Policy, Result, Run
from app.core.store import Store


def runs(store: Store, *, kind: str | None = None) -> list[Run]:
    """Every run (or every run of a kind), newest first, with its row, error and accuracy counts."""
    return store.list_runs(kind=kind)


def run(store: Store, run_id: int) -> Run | None:
    """One run, None when there is none (a link to a deleted run)."""
    return store.get_run(run_id)


def results(store: Store, run_id: int) -> list[Result]:
    """A run's results in row order."""
    return store.results(run_id)


def run_version(store: Store, run_id: int) -> tuple[int, int]:
    """(results stored, newest result id): changes with every stored result - a page's cache key."""
    return store.run_version(run_id)


def baseline(store: Store) -> Run | None:
    """The run pinned as the baseline, if any."""
    return store.pinned_run()


def policies(store: Store) -> list[Policy]:
    """The saved policies, by name (none yet: an empty list)."""
    return store.list_policies()


def policy(store: Store, policy_id: str) -> Policy | None:
    """One saved policy, None when there is none."""
    return store.get_policy(policy_id)


def labeled_sets(store: Store) -> list[LabeledSet]:
    """Every stored labeled set, newest first."""
    return store.list_labeled_sets()


def audit_log(store: Store, deployment_id: str) -> list[AuditEntry]:
    """What was planned, applied and destroyed for a deployment, and by whom."""
    return store.audit_log(deployment_id)
