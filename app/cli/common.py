"""What every workbench command shares: the store, a target by name (one model pool per process), and
a progress bar on stderr. Commands only parse arguments, call app/service and print."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from adapter.env_settings import finite
from adapter.schema import id_problem

from app.targets.engines import EnginePool
from app.core.store import Store
from app.service import inputs
from app.service import targets as target_service
from app.service.inputs import Ask, Columns, Inputs
from app.targets.base import Target

from app.cli.exit_codes import EXIT_BUSY as EXIT_BUSY
from app.cli.exit_codes import EXIT_FAILED as EXIT_FAILED
from app.cli.exit_codes import EXIT_OK as EXIT_OK
from app.cli.exit_codes import EXIT_STORE as EXIT_STORE
from app.cli.exit_codes import EXIT_UNREACHABLE as EXIT_UNREACHABLE
from app.cli.exit_codes import EXIT_USAGE as EXIT_USAGE
from app.cli.exit_codes import UsageProblem as UsageProblem


def store(args: Any) -> Store:
    return Store(args.db)


def target(db: Store, name: str, pool: EnginePool | None = None) -> Target:
    """--target NAME; SystemExit naming the targets there are. `pool`: share one EnginePool between the
    command's targets (calibrate's head sources, scored source by source: a source on the target's model
    reuses its engine, and at most SEMIF_MAX_LOADED_MODELS models are resident - not one per target)."""
    try:
        return target_service.by_name(db, name, pool or EnginePool())  # one model load for the whole command
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None


def resolve(db: Store, ask: Ask) -> Inputs:
    """The command's inputs in one service call (app/service/inputs.py); the importer's mapping as read is
    printed to stderr; a bad input: UsageProblem naming its flag (exit 2), before anything is scored."""
    try:
        given = inputs.resolve(db, ask)
    except inputs.InputsError as exc:
        raise UsageProblem(str(exc)) from None
    for line in given.notes:
        print(line, file=sys.stderr)
    return given


def left_out(problems: list[str], capped: str = "", shown: int = 20) -> None:
    """A file's rows left out (the first `shown`, then how many more) and its cap, on stderr."""
    for p in problems[:shown]:
        print(f"left out: {p}", file=sys.stderr)
    if len(problems) > shown:
        print(f"left out: {len(problems) - shown} more rows", file=sys.stderr)
    if capped:
        print(f"capped: {capped}", file=sys.stderr)


def add_mapping(p: Any, flag: str) -> None:
    """The importer's mapping flags of a file argument (`flag`), as on the Calibrate page's import."""
    for what in ("state", "label", "id"):
        p.add_argument(f"--{what}-column", help=f"the {flag} file's {what} column (default: `{what}`, else the "
                                                 "importer's proposal: the longest free-text column is the state)")
    p.add_argument("--map-label", action="append", type=label_pair, metavar="VALUE=OPTION",
                   help=f"read the {flag} file's label VALUE as the policy's option OPTION; repeat (default: values "
                        "that match an option once case, spaces and dashes are set aside)")


def columns(args: argparse.Namespace) -> Columns:
    return Columns(args.state_column, args.label_column, args.id_column, tuple(args.map_label or ()))


# -- argument types: every argument is checked when it is parsed, before any scoring ------------------
def rate(text: str) -> float:
    """A rate or probability in [0, 1] (NaN and Infinity refused as not numbers)."""
    value = finite(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and 1: give a rate, e.g. 0.8 for 80%")
    return value


def target_rate(text: str) -> float:
    """A target accuracy: above 0, at most 1."""
    value = rate(text)
    if value == 0:
        raise argparse.ArgumentTypeError("0 is no target: give an accuracy above 0, e.g. 0.9")
    return value


def count(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0")
    return int(text)


def share(text: str) -> float:
    """A share between 0 and 1 (--random-share): NaN, infinities and values outside [0, 1] refused (argparse then
    exits 2 naming the flag)."""
    value = finite(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a share between 0 and 1 (e.g. 0.25: a quarter of each batch)")
    return value


def label_pair(text: str) -> tuple[str, str]:
    """--map-label VALUE=OPTION: a label value of the file and the option id it is read as."""
    value, sep, option = text.partition("=")
    if not sep or not value.strip() or not option.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: give VALUE=OPTION, e.g. 'Feature Request=feature_request'")
    return value.strip(), option.strip()


def option_id(text: str) -> str:
    """An option id given on the command line (a fallback): the adapter's id rule."""
    problem = id_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{text!r} {problem}" if not problem.startswith(repr(text)) else problem)
    return text


def out_file(text: str) -> str:
    """A file the command will write: not a folder, in an existing writable folder, itself writable."""
    path = Path(text).expanduser()
    if not text.strip():
        raise argparse.ArgumentTypeError("give a file name")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder: give a file name in it, e.g. {path / 'out.json'}")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"the folder {parent} does not exist: create it first")
    if path.exists() and not path.is_file():  # a FIFO would block the probe (and the command); a device is no file
        raise argparse.ArgumentTypeError(f"{text} is not a regular file (a FIFO, socket or device): give a file name")
    existed = path.exists()
    try:  # really opened for writing (permission bits say nothing for root, or on a read-only mount)
        with path.open("a"):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{text} cannot be written ({exc.strerror or exc}): choose a writable place")
    if not existed:
        path.unlink(missing_ok=True)  # the probe leaves nothing behind
    return text


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
