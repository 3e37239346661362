"""What every workbench command shares: the store, a target by name (one model pool per process), and
a progress bar on stderr. Commands only parse arguments, call app/service and print."""
from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm

from app.targets.engines import EnginePool
from app.core.store import Store
from app.service import targets as target_service
from app.targets.base import Target

EXIT_OK, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_BUSY = 0, 2, 3, 4


def store(args: Any) -> Store:
    return Store(args.db)


def target(db: Store, name: str) -> Target:
    """--target NAME; SystemExit naming the targets there are."""
    try:
        return target_service.by_name(db, name, EnginePool())  # one model load for the whole command
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def error(message: object) -> None:
    print(f"error: {message}", file=sys.stderr)


def bar(total: int, quiet: bool = False) -> Any:
    """A tqdm bar on stderr; its `progress` attribute is the callback the service layer takes."""
    b = tqdm(total=total, unit="row", file=sys.stderr, disable=quiet)

    def progress(done: int, total: int, eta: float | None) -> None:
        b.total = total
        b.n = done
        b.refresh()

    b.progress = progress
    return b


def add_db(p: Any) -> None:
    p.add_argument("--db", help="SQLite file (default: SEMIF_DB or data/workbench.db)")


def fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"
