"""One call per command: what a command works on - its policy, a labeled set or a file of states (read through
the importer's column and label mapping, app/core/importer.py), calibrated policies and targets - resolved once
into one typed `Inputs`, with at most one store call per input (tests/test_one_call.py counts them). `calibrate`,
`bench`, `robustness`, `check` and `import-log` ask with an `Ask` and hand the `Inputs` to their action.

Bad input raises InputsError naming the flag and the fix (the commands exit 2); nothing is scored before every
input is resolved. A labeled-set file is imported last, once the other inputs are known good (an unchanged file is
the set already stored); a template or file policy is saved on first use, as before."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from adapter.engine.templates import DATA_DIR
from adapter.policy import CalibratedPolicy

from app.core import inputs as files
from app.core.deployed import AsDeployed
from app.core.inputs import InputError, read_file
from app.core.labeled import ColumnMap, cases_of, evenly_spaced, import_cases
from app.core.runner import Case
from app.core.store import Store
from app.service import heads
from app.service.policies import resolve_policy
from app.service.sets import cli_mapping
from app.targets.base import Target, TargetError
from app.targets.engines import EnginePool
from app.targets.registry import UnknownTarget, build_target, target_specs

Policy = Mapping[str, Any]  # a policy record (app/core/records.Policy) or a policy dict


class InputsError(ValueError):
    """An input a command cannot use: the message names its flag and the fix; `problems` the file's rows."""

    def __init__(self, flag: str, message: str, problems: Sequence[str] = ()):
        super().__init__(message if message.startswith(flag) else f"{flag} {message}")
        self.flag = flag
        self.problems = list(problems)


@dataclass(frozen=True)
class Columns:
    """The importer's mapping flags of a labeled-set or states file: --state-column, --label-column, --id-column
    (None: the file's own `state`/`label`/`id`, else the importer's proposal) and --map-label VALUE=OPTION."""
    state: str | None = None
    label: str | None = None
    id: str | None = None
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def given(self) -> bool:
        return bool(self.state or self.label or self.id or self.labels)


@dataclass(frozen=True)
class Ask:
    """What a command asks for, as given on its command line (each field names the flag it came from)."""
    policy: str  # --policy: a saved policy id, a template id or a policy JSON file
    labeled_set: str | None = None  # --labeled-set: a CSV/JSONL file (imported; or a file name in data/labeled), a set id
    set_cases: bool = False  # also take the set's rows (never its train split) as the states (robustness)
    states: str | None = None  # --states: a CSV/JSONL of states (labels optional, the policy's options)
    limit: int | None = None  # at most this many states, evenly spaced
    columns: Columns = Columns()
    calibrated: tuple[str, ...] = ()  # --calibrated: saved ids, files or models:/ references
    # check's reader of --policy, which may be a calibrated policy file: (the policy, the calibrated policy or None)
    policy_reader: Callable[[Store, str], tuple[Policy, CalibratedPolicy | None]] | None = field(default=None,
                                                                                              compare=False)
    targets: tuple[str, ...] = ()  # --target (repeatable for bench), --replay-on
    target_flag: str = "--target"
    head_sources: tuple[str, ...] = ()  # --head-sources: local targets only
    pool: EnginePool | None = field(default=None, compare=False)  # one model pool for every target built


@dataclass(frozen=True)
class Inputs:
    """A command's inputs, resolved: what its service action takes."""
    policy: Policy
    set_id: int | None = None
    cases: tuple[Case, ...] = ()
    source: str = ""  # where the states came from: "labeled set FILE" or the states file
    calibrated: tuple[AsDeployed, ...] = ()
    policy_file: CalibratedPolicy | None = None  # --policy was a calibrated policy file (check): its gate is used
    targets: tuple[Target, ...] = ()
    head_sources: tuple[Target, ...] = ()
    notes: tuple[str, ...] = ()  # the importer's mapping as read (columns, label values, the first rows)

    @property
    def target(self) -> Target:
        return self.targets[0]

    @property
    def pick(self) -> AsDeployed | None:
        """The one calibrated policy a robustness check tests as deployed, if any."""
        return self.calibrated[0] if self.calibrated else None


def resolve(store: Store, ask: Ask) -> Inputs:
    """Every input of `ask`, each with at most one store call: the policy (Store.policy_or_saved), the labeled
    set (one import, or one read of a stored set with its rows), the calibrated policies (Store.calibrated_reads,
    all at once), the targets and head sources (Store.list_targets, once). InputsError naming the flag."""
    policy_file: CalibratedPolicy | None = None
    try:
        if ask.policy_reader is not None:
            policy, policy_file = ask.policy_reader(store, ask.policy)
        else:
            policy = resolve_policy(store, ask.policy)
    except ValueError as exc:  # PolicyNotFound (its message names --policy), check's UsageError
        raise InputsError("--policy", str(exc)) from None
    try:  # what only reads comes first: a bad --calibrated or --target imports no set
        calibrated = tuple(heads.as_deployed_all(store, list(ask.calibrated)))
    except ValueError as exc:
        raise InputsError("--calibrated", str(exc).removeprefix("calibrated: ")) from None
    targets, sources = _targets(store, ask)
    notes: list[str] = []
    set_id: int | None = None
    cases: tuple[Case, ...] = ()
    source = ""
    if ask.labeled_set is not None:
        set_id, scored, notes = _labeled_set(store, ask, policy)
        if ask.set_cases:
            cases, source = tuple(evenly_spaced(scored, ask.limit)), f"labeled set {ask.labeled_set}"
    elif ask.states is not None:
        cases, notes = _states(ask, policy)
        source = str(Path(ask.states))
    return Inputs(policy, set_id, cases, source, calibrated, policy_file, targets, sources, tuple(notes))


def _labeled_set(store: Store, ask: Ask, policy: Policy) -> tuple[int, list[Case], list[str]]:
    """(set id, its rows outside the train split as cases, the mapping lines): a file imported through the
    mapping, or a stored set id."""
    ref = str(ask.labeled_set)
    path = Path(ref)
    if not path.is_file() and (DATA_DIR / "labeled" / ref).is_file():
        path = DATA_DIR / "labeled" / ref
    if path.is_file():
        data = _read(path, "--labeled-set")
        columns, notes = mapping("--labeled-set", ref, path.name, data, policy, ask.columns)
        try:
            set_id, scored = import_cases(store, path.name, data, policy, source=str(path), columns=columns)
        except InputError as exc:
            raise InputsError("--labeled-set", f"{ref}: rejected, nothing imported:\n  " + "\n  ".join(exc.problems[:20]),
                              exc.problems) from None
        return set_id, scored, notes
    if ask.columns.given:
        raise InputsError("--state-column/--label-column/--id-column/--map-label",
                          f"read a file; --labeled-set {ref!r} is no file: give the file, or drop the mapping flags")
    if ref.isdigit():
        found, stored = store.labeled_set_rows(int(ref))
        if found is not None:
            return int(ref), cases_of(stored), []
    raise InputsError("--labeled-set", f"{ref!r}: no such file or stored set id")


def _states(ask: Ask, policy: Policy) -> tuple[tuple[Case, ...], list[str]]:
    """A file of states read through the mapping: labels, when given, the policy's options; `limit` evenly spaced."""
    path = Path(str(ask.states))
    data = _read(path, "--states")
    columns, notes = mapping("--states", str(ask.states), path.name, data, policy, ask.columns)
    try:
        rows = files.rows_from_upload(path.name, data, [o["id"] for o in policy["options"]], policy["id"],
                                      columns=columns)
    except InputError as exc:
        raise InputsError("--states", f"{ask.states}: rejected, nothing was run:\n  " + "\n  ".join(exc.problems[:20]),
                          exc.problems) from None
    return tuple(evenly_spaced(rows, ask.limit)), notes


def _read(path: Path, flag: str) -> bytes:
    try:
        return read_file(path, flag)
    except InputError as exc:
        raise InputsError(flag, "; ".join(exc.problems), exc.problems) from None
    except OSError as exc:
        raise InputsError(flag, f"{path}: cannot be read ({exc.strerror or exc})") from None


def mapping(flag: str, ref: str, name: str, data: bytes, policy: Policy, given: Columns) -> tuple[ColumnMap | None, list[str]]:
    """The importer's mapping of a file from the command line's flags (app/service/sets.cli_mapping), with the
    lines to print; a column flag that names no column of the file, or a --map-label to no option: InputsError
    naming that flag. A file without a `state` column and no flag: InputsError proposing the flags."""
    if given.given:
        have = files.columns(name, data)
        for what, column in (("state", given.state), ("label", given.label), ("id", given.id)):
            if column is not None and column not in have:
                raise InputsError(f"--{what}-column", f"{column!r}: {ref} has no such column; its columns: "
                                  f"{', '.join(have) or 'none'}")
        ids = [o["id"] for o in policy["options"]]
        for value, option in given.labels:
            if option not in ids:
                raise InputsError("--map-label", f"{value}={option}: {option!r} is not an option of policy "
                                  f"{policy['id']!r} ({', '.join(ids)})")
    columns, lines = cli_mapping(name, data, policy, state=given.state, label=given.label, ident=given.id,
                                 labels=dict(given.labels))
    if columns is None and lines:
        raise InputsError(flag, f"{ref}: " + " ".join(lines))
    return columns, lines


def _targets(store: Store, ask: Ask) -> tuple[tuple[Target, ...], tuple[Target, ...]]:
    """The targets and head sources by name, from one read of the saved targets, sharing one model pool."""
    if not ask.targets and not ask.head_sources:
        return (), ()
    specs = target_specs(store)
    by_name = {s["name"]: s for s in specs}
    pool = ask.pool or EnginePool()  # one model load for the whole command

    def build(name: str, flag: str) -> Target:
        if name not in by_name:
            raise InputsError(flag, f"{name!r}: no such target; saved targets: {', '.join(by_name)}")
        try:
            return build_target(by_name[name], engine_provider=pool)
        except (UnknownTarget, TargetError, ValueError) as exc:  # a saved spec that cannot be built
            raise InputsError(flag, f"{name!r}: {exc}") from None

    local = [s["name"] for s in specs if s.get("kind") == "local"]
    if remote := [n for n in ask.head_sources if n not in local]:  # refused before any target is built or row sent
        raise InputsError("--head-sources", f"{', '.join(remote)}: not a local model (local: {', '.join(local) or 'none'}) "
                          "- a head source reads hidden states, which only a local model gives")
    return (tuple(build(n, ask.target_flag) for n in ask.targets),
            tuple(build(n, "--head-sources") for n in ask.head_sources))
