"""Deciding: a policy on one state (Playground), on many states against several targets (Compare),
and the latency benchmark (`python -m app bench`) - all saved as run groups and read back the same
way, so the page and the command line show the same numbers for the same group."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence, cast

import pandas as pd

from adapter.schema import DEBIAS, READOUTS
from adapter.engine.templates import request_for

from app.core import analysis, deployed
from app.core.run_calibration import gate_preview
from app.core.deployed import AsDeployed
from app.core.runs import Variant, label_mismatch
from app.core.inputs import InputError as InputError
from app.core.inputs import is_empty_state, rows_from_upload, state_from_file
from app.core.inputs import read_file as read_file  # re-exported: the commands read their input files with it
from app.core.labeled import ColumnMap, evenly_spaced, stratified
from app.core.runner import Case, ProgressFn, is_cold, run_policy
from app.core.runner import new_group_id as new_group_id
from app.core.runner import progress_text as progress_text
from app.core.records import Run, config_of
from app.core.snippets import for_target
from app.core.store import Store
from app.service import tracking as tracked
from app.service.inputs import Inputs
from app.core.stored import NO_RESPONSE, StoredResponse
from app.targets.base import Target

Policy = Mapping[str, Any]  # a policy record (app/core/records.Policy) or a policy dict
WARM_UP_STATE = "Warm-up call before the benchmark (not measured)."


def option_ids(policy: Policy) -> list[str]:
    return [o["id"] for o in policy["options"]]


def states_from_upload(policy: Policy, filename: str, data: bytes, *, limit: int | None = None,
                       columns: ColumnMap | None = None) -> list[Case]:
    """A CSV/JSONL of states (optional id, label, policy). Labels must be the policy's option ids - a
    label no option matches could never be answered right, so the file is refused naming those rows;
    a file with a `policy` column gives this policy's rows (one rule for the Compare page and `app bench`).
    With `limit`, at most that many rows, evenly spaced (every label keeps about its share). `columns`: the
    importer's mapping (app/core/importer.py), else the file's own `state`, `label` and `id` columns."""
    return evenly_spaced(rows_from_upload(filename, data, option_ids(policy), policy["id"], columns=columns), limit)


def states_from_set(store: Store, policy: Policy, set_id: int, *, limit: int | None = None) -> list[Case]:
    """A stored labeled set's rows as states with their labels (the train split too: Compare measures, it fits
    nothing); ValueError when its labels are not this policy's options. With `limit`, evenly spaced."""
    rows = store.labeled_rows(set_id)
    if not rows:
        raise ValueError(f"labeled set #{set_id} has no rows (deleted?): pick another set")
    if problem := label_mismatch(policy, rows):
        raise ValueError(problem)
    return evenly_spaced([Case(str(r["row_key"]), r["state"], r["label"]) for r in stratified(rows)], limit)


def decide(store: Store, policy: Policy, state: object, targets: list[Target], *, overrides: dict[str, Any] | None = None,
           progress: ProgressFn | None = None) -> str:
    """The Playground: one state on every chosen target, saved as a group; returns the group id."""
    group, _ = run_policy(store, policy, [Case("playground", state)], targets, kind="playground", overrides=overrides,
                          progress=progress)
    return group


def state_from(upload_name: str | None, upload: bytes | None, typed: str) -> object:
    """The Playground's state: an uploaded file (a .json file is an object state), else the typed
    text; InputError when neither holds anything."""
    state: object = state_from_file(upload_name, upload) if upload_name and upload is not None else typed
    if is_empty_state(state):
        raise InputError(["State is empty: paste a ticket or log, or upload a file."])
    return state


def head_problems(policy: Policy, heads: Sequence[AsDeployed]) -> list[str]:
    """Why a picked calibrated policy's head cannot be a column of this policy's comparison (another
    policy's, or other options), naming the field."""
    return [problem for p in heads if (problem := deployed.policy_problem(p, policy))]


def compare(store: Store, policy: Policy, cases: list[Case], targets: list[Target],
            progress: ProgressFn | None = None, heads: Sequence[AsDeployed] = (), reuse: bool = True,
            group_id: str | None = None) -> str:
    """Every state on every target (cases outer, targets inner), saved as a comparison group. Labeled
    states are scored in stratified order, as evaluations are (labeled.stratified): a run stopped early is a
    fair sample, not the file's first class. With `reuse` (the page; not `app bench`, which measures
    latency), a state already answered by the same model to the same request is copied (app/core/reuse.py):
    its answer is the same bits, and its latency is left out of the latency figures. With
    learned heads (calibrated policies of this policy), the targets that can return hidden states are
    asked for them and the heads are recorded with the runs: the comparison then shows a column per
    head and target of its model (analysis.head_columns). InputError for a head of another policy."""
    if not cases:
        raise InputError(["States: paste at least one line or upload a file."])
    problems = head_problems(policy, heads)
    if problems:
        raise InputError(problems)
    # rows ask for their hidden state where the target can return it, as evaluations' rows do: the same
    # request, so an evaluation's stored answer stands in (and a head can read the row)
    hidden = reuse or any(p.needs_hidden and not p.head_layout for p in heads)
    layout = any(p.head_layout for p in heads)  # a head-layout head: its targets also read the rows in that layout
    if any(c.label for c in cases):
        order: list[dict[str, Any]] = stratified([{"label": c.label, "i": i} for i, c in enumerate(cases)])
        cases = [cases[int(r["i"])] for r in order]
    group, _ = run_policy(store, policy, cases, targets, kind="compare", progress=progress, group_id=group_id,
                          hidden=(lambda t: t.returns_hidden()) if hidden else None,
                          config={"heads": [p.record() for p in heads]} if heads else None, reuse=reuse,
                          head_layout=[t for t in targets if t.returns_hidden()] if layout else ())
    tracked.comparison_group(store, group)  # MLflow, when SEMIF_MLFLOW_TRACKING_URI is set (never raises)
    return group


@dataclass
class Comparison:
    """A saved comparison as the Compare page and `app bench` show it."""
    runs: Sequence[Mapping[str, Any]]
    results: pd.DataFrame  # one row per (target, state)
    latency: pd.DataFrame  # per target: warm p50/p95/max/IQR, cold call, decisions/s, $/1,000
    accuracy: pd.DataFrame  # per target: labeled, correct, wrong, accuracy with a Wilson interval
    agreement: pd.DataFrame  # target x target: share of states with the same top option
    answers: pd.DataFrame  # per state: each target's answer, disagree, wrong
    degenerate: list[analysis.Degenerate] = field(default_factory=list)  # targets answering >= 90% of rows with one option
    confusion: dict[str, list[list[int]]] = field(default_factory=dict)  # per target, labels x answers
    heads: pd.DataFrame = field(default_factory=pd.DataFrame)  # per head column: read, accuracy, gated share
    head_notes: list[str] = field(default_factory=list)  # why a target got no column for a head

    @property
    def stopped(self) -> str | None:
        """'stopped after 13 of 50 states' when a run of it ended before every state was answered."""
        return stopped_text(self.runs)

    @property
    def warm(self) -> pd.DataFrame:
        """The rows the latency table and plots both read (analysis.warm_calls)."""
        return analysis.warm_calls(self.results)

    @property
    def reused(self) -> int:
        """Rows copied from stored results of the same model and request (no call made)."""
        return int(self.results["reused"].sum()) if "reused" in self.results else 0

    @property
    def option_ids(self) -> list[str]:
        return option_ids(self.runs[0]["policy"]) if self.runs else []

    @property
    def name(self) -> str:
        return comparison_name(self.runs)

    @property
    def file_stem(self) -> str:
        """'ticket-routing-local-vs-adapter-12' for downloads."""
        first = self.runs[0]
        text = f"{first['policy_id']}-{'-vs-'.join(r['target_name'] for r in self.runs)}-{first['id']}"
        return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:120]


def stopped_text(runs: Sequence[Mapping[str, Any]]) -> str | None:
    """'stopped after 13 of 50 states' when a finished run of a comparison answered fewer states than
    it was given (Stop, a closed page); None while it runs or when every state was answered."""
    if not runs or any(r["status"] == "running" for r in runs):
        return None
    n = int(runs[0]["n_rows"])
    done = min(int(r.get("done_rows") or 0) for r in runs)
    return f"stopped after {done} of {n} states" if done < n else None


def comparison_name(runs: Sequence[Mapping[str, Any]]) -> str:
    """'Ticket routing v3 · local vs adapter · 24 states · 2026-12-01 09:14 · #12' (or 'stopped after 13 of 50
    states'): the policy with the version the comparison asked."""
    first = runs[0]
    version = first["policy"].get("version")
    return (f"{first['policy'].get('name')}{f' v{version}' if version is not None else ''} · {' vs '.join(r['target_name'] for r in runs)} · "
            f"{stopped_text(runs) or str(first['n_rows']) + ' states'} · {first['created_at'][:16].replace('T', ' ')} "
            f"· #{first['id']}")


def recorded_heads(store: Store, runs: Sequence[Mapping[str, Any]]) -> list[AsDeployed]:
    """The learned heads a comparison was run with (kept in its runs' config: JSON and sha256)."""
    records = (config_of(runs[0]).get("heads") or []) if runs else []
    return [deployed.recorded(store, r) for r in records]


def comparison(store: Store, group_id: str, heads: Sequence[AsDeployed] | None = None) -> Comparison:
    """A saved comparison as the page and `app bench` show it; a column per learned head it was run with
    (or `heads`) and target of that head's model, with why the other targets have none."""
    runs = store.runs_in_group(group_id)
    frames = analysis.comparison_frames(store, group_id, recorded_heads(store, runs) if heads is None else heads)
    df = frames.results
    answered = df[df["run_id"].isin([r["id"] for r in runs])].groupby("run_id")["row_key"].nunique()
    runs = [cast(Run, {**r, "done_rows": int(answered.get(r["id"], 0))}) for r in runs]
    ids = option_ids(runs[0]["policy"]) if runs else []
    return Comparison(runs, df, frames.latency, analysis.accuracy_by_target(df), analysis.agreement_matrix(df),
                      analysis.disagreements(df), analysis.degenerate_targets(df), analysis.confusion_by_target(df, ids),
                      frames.heads, frames.head_notes)


def comparisons(store: Store) -> dict[str, list[Run]]:
    """Saved comparisons, newest first: group id -> its runs in target order."""
    groups: dict[str, list[Run]] = {}
    for r in store.list_runs(kind="compare"):
        groups.setdefault(r["group_id"], []).insert(0, r)
    return groups


def bench(store: Store, given: Inputs, progress: ProgressFn | None = None) -> Comparison:
    """The same states (`given.cases`) sent sequentially to each target after one warm-up call each (model loads,
    connections and the policy's first pass are not measured; the warm-up has a state of its own, so no measured
    row is answered from kept logits), saved as a comparison the Compare page opens; a column per calibrated
    policy of `given` (its head or correction, gate) on the targets of its model."""
    policy, targets = given.policy, list(given.targets)
    for t in targets:
        warm = request_for(policy, WARM_UP_STATE, "warm-up")
        is_cold(t, warm)  # counted as this target's first call, so every measured call is warm
        t.decide(warm)
    return comparison(store, compare(store, policy, list(given.cases), targets, progress, given.calibrated, reuse=False))


@dataclass
class Card:
    """One target's answer to a Playground state, with what is needed to read it."""
    run: Mapping[str, Any]
    result: Mapping[str, Any] | None
    latency: str  # "this call 2.1 s (warm) · recent warm calls: p50 …"
    gate: str | None = None  # what the saved calibrated policy of this policy would do with it


@dataclass
class Decision:
    group_id: str
    state: object
    cards: list[Card]
    tops: dict[str, str]  # target -> top option, for targets that answered

    @property
    def agree(self) -> bool:
        return len(set(self.tops.values())) <= 1


def decision(store: Store, group_id: str) -> Decision | None:
    """A Playground group read back: per target its result, latency in context and the calibrated
    gate's verdict on it; None when the group was deleted."""
    runs = store.runs_in_group(group_id)
    if not runs:
        return None
    warm = analysis.warm_latencies(store, {r["target_name"] for r in runs})
    calibrated = store.list_calibrated()
    cards: list[Card] = []
    tops: dict[str, str] = {}
    for run in runs:
        res = next(iter(store.results(run["id"])), None)
        gate = None
        if res is not None and not res["error"]:
            tops[run["target_name"]] = str(res["top_option"])
            preview = gate_preview(calibrated, run["policy_id"], res)
            if preview is not None:
                rec, d = preview
                verb = (f"send it to {d.option_id} ({d.reason})" if d.gated else
                        f"decide {d.option_id} (calibrated confidence {d.confidence:.1%} ≥ its gate)")
                gate = f"Calibrated policy #{rec['id']} (gate {rec['threshold']:.3f}) would {verb}."
        latency = analysis.latency_sentence(
            res["latency_s"], bool(res.get("cold")), warm.get(run["target_name"]),
            local=(run.get("target") or {}).get("kind") == "local",
            prior=bool((StoredResponse.of(res) or NO_RESPONSE).prior)) if res is not None else ""
        cards.append(Card(run, res, latency, gate))
    first = cards[0].result
    return Decision(group_id, first["state"] if first else None, cards, tops)


def snippets(target: dict[str, Any], request: dict[str, Any] | None, response: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """Code that sends the request the way the workbench did, with the readout and correction the
    target resolved pinned in (a snippet on another model runs the same); keys stay variable names."""
    return for_target(target, request, response)


READOUT_CHOICES: tuple[str, ...] = READOUTS
DEBIAS_CHOICES: tuple[str, ...] = DEBIAS


def overrides(readout: str | None, debias: str | None, permute: bool) -> dict[str, Any]:
    """A run's settings over the policy's (None: the policy's own, else the model's measured default) -
    the same rule as an evaluation's readout variant, because it is that rule."""
    return Variant(readout=readout, debias=debias, permute=permute).overrides()
