"""Labeled sets: find one by file, shipped name or id; import the shipped sets or an upload; say
what a set can support before anything is scored."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from adapter.templates import DATA_DIR

from app.core.inputs import InputError
from app.core.labeled import import_file, set_support, shipped_sets
from app.core.store import Store

Policy = dict[str, Any]


class SetNotFound(ValueError):
    """A --labeled-set reference that is no file, shipped set or stored set id."""


def resolve_set(store: Store, ref: str, policy: Policy) -> int:
    """A CSV/JSONL file (or a file name in data/labeled) imported for `policy`, or a stored set id.
    Raises SetNotFound, or InputError naming the rows a file was rejected for (nothing imported)."""
    path = Path(ref)
    if not path.is_file() and (DATA_DIR / "labeled" / ref).is_file():
        path = DATA_DIR / "labeled" / ref
    if path.is_file():
        return import_file(store, path.name, path.read_bytes(), policy, source=str(path))
    if ref.isdigit() and store.get_labeled_set(int(ref)):
        return int(ref)
    raise SetNotFound(f"--labeled-set {ref!r}: no such file or stored set id")


def import_shipped(store: Store, policies: dict[str, Policy]) -> int:
    """Import the shipped set of every shipped policy present (an unchanged set is not imported
    twice); how many sets are now available."""
    n = 0
    for pid, path in shipped_sets():
        if pid in policies:
            import_file(store, path.name, path.read_bytes(), policies[pid], source=str(path))
            n += 1
    return n


def import_upload(store: Store, name: str, data: bytes, policy: Policy) -> int:
    """An uploaded set whose labels are `policy`'s options; InputError lists the rows to fix."""
    return import_file(store, name, data, policy)


def support(store: Store, set_id: int, policy: Policy) -> dict[str, Any]:
    """What the set can support for this policy before scoring (rows per option, gate, offsets)."""
    return set_support(store.labeled_rows(set_id), [o["id"] for o in policy["options"]])


__all__ = ["InputError", "SetNotFound", "import_shipped", "import_upload", "resolve_set", "support"]
