"""A pool of unlabeled states kept in the workbench (issue 44, item 4): imported once (a CSV/JSONL through the
shared importer's column guess, or a decision log already imported), scored once with the chosen candidate,
ranked for labeling from the stored scores, labeled row by row (a review action: who and when), and the
labels added to the labeled set as a new version (review.add_version: the parent set never changes).

Scored once: the pool's rows are sent with exactly the requests the candidate's own evaluation run sends
(its policy as evaluated, its readout or head layout, with the hidden state a head reads), as a run of kind
"pool". Each stored result carries its reuse key (app/core/reuse.py), so
- the next suggestion reads the stored scores and scores only rows it has not (`Scored.reused` counts them);
- the next calibration on the new set version copies the stored result of every pool row that was labeled
  (the calibration's own "copied from stored results" count) instead of scoring its state again.
A candidate is a calibrated policy (its head or correction turns the stored reading into probabilities:
CalibratedPolicy.corrected); a policy file whose evaluation run is not in this workbench is scored with the
file's own request fields (the adapter's rendering of it).
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, TextIO

import numpy as np

from adapter.policy import CalibratedPolicy
from adapter.schema import DecisionRequest

from app.core import pool as pool_rows
from app.core import pool_store, review
from app.core import suggest as ranking
from app.core.pool_store import StoredPool as StoredPool  # the page's type of a pool
from app.core.records import Result, Run
from app.core.runner import Case, Job, ProgressFn, score_into_runs
from app.core.store import Store
from app.service.tasks import Task
from app.core.stored import NO_RESPONSE, StoredResponse
from app.targets.base import Target, TargetError

HEAD_BYTES = 64 << 10  # the first bytes the importer's column guess reads (the file itself is streamed)
LOG_KINDS = ("production",)  # a decision log imported by `app import-log` / the Deploy page


class PoolProblem(ValueError):
    """Bad pool input: the message names the file, the pool or the row, and the fix; nothing was saved."""


@dataclass(frozen=True)
class Imported:
    pool_id: int
    rows: int
    problems: list[str]  # every row left out, by line
    capped: str

    @property
    def text(self) -> str:
        left = f"; {len(self.problems)} rows left out (each named below)" if self.problems else ""
        return f"pool #{self.pool_id}: {self.rows} unlabeled rows kept{left}" + (f". {self.capped}" if self.capped else "")


def known_states(store: Store, policy_id: str, set_id: int | None) -> set[str]:
    """State keys that already carry a label: the set's rows and every review of the policy (pending or added)."""
    known = {pool_rows.state_key(r["state"]) for r in store.labeled_rows(set_id)} if set_id is not None else set()
    return known | {pool_rows.state_key(r["state"]) for r in store.reviews(policy_id)}


def import_stream(store: Store, policy: Mapping[str, Any], fh: TextIO, filename: str, *, into_set: int | None,
                  name: str = "", head: bytes = b"", cap: int = pool_rows.MAX_ROWS) -> Imported:
    """A CSV/JSONL of states streamed into a new pool of `policy` (its rows read line by line up to `cap`);
    `head`: the file's first bytes, for the importer's guess of the state and id columns. PoolProblem when
    no row is usable (nothing saved)."""
    if not filename.lower().endswith((".csv", ".jsonl", ".json", ".ndjson")):
        raise PoolProblem(f"{filename}: a pool is a .csv (a state column) or a .jsonl file ({{\"state\": ...}} a line)")
    state, ident = pool_rows.columns_of(filename, head) if head else ("state", "id")
    ids = [o["id"] for o in policy["options"]]
    found = pool_rows.read_pool(fh, filename, ids, policy["id"], known=known_states(store, policy["id"], into_set),
                                cap=cap, state=state, id_column=ident)
    if not found.rows:
        why = "; ".join(found.problems[:5]) if found.problems else "the file is empty"
        raise PoolProblem(f"{filename}: no usable row, nothing saved - {why}")
    pid = pool_store.add(store, name=name or Path(filename).name, policy_id=policy["id"], source=f"file {Path(filename).name}",
                         rows=found.rows, problems=found.problems, capped=found.capped)
    return Imported(pid, len(found.rows), found.problems, found.capped)


def import_file(store: Store, policy: Mapping[str, Any], path: str, *, into_set: int | None, name: str = "",
                cap: int = pool_rows.MAX_ROWS) -> Imported:
    """import_stream on a file on disk; PoolProblem naming it when it cannot be read."""
    try:
        with open(path, "rb") as raw:
            head = raw.read(HEAD_BYTES)
        with open(path, encoding="utf-8") as fh:
            return import_stream(store, policy, fh, path, into_set=into_set, name=name, head=head, cap=cap)
    except (OSError, UnicodeDecodeError) as exc:
        raise PoolProblem(f"{path}: cannot read it ({exc})") from None


def import_upload(store: Store, policy: Mapping[str, Any], filename: str, data: bytes, *, into_set: int | None,
                  cap: int = pool_rows.MAX_ROWS) -> Imported:
    """An uploaded file (the Review page) as a pool; PoolProblem when it is not UTF-8 or has no usable row."""
    try:
        text = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
        return import_stream(store, policy, text, filename, into_set=into_set, head=data[:HEAD_BYTES], cap=cap)
    except UnicodeDecodeError as exc:
        raise PoolProblem(f"{filename}: not UTF-8 text ({exc.reason} at byte {exc.start}) - save it as UTF-8") from None


def import_log(store: Store, policy: Mapping[str, Any], run_id: int, *, into_set: int | None) -> Imported:
    """A decision log already imported (a production run) as a pool: its logged states without a label."""
    run = store.get_run(run_id)
    if run is None or run["kind"] not in LOG_KINDS:
        raise PoolProblem(f"run #{run_id}: not an imported decision log (import one with `python -m app import-log` "
                          "or on Deploy)")
    if run["policy_id"] != policy["id"]:
        raise PoolProblem(f"run #{run_id} is a decision log of policy {run['policy_id']!r}, not {policy['id']!r} - "
                          "pick a log of this policy")
    known = known_states(store, policy["id"], into_set)
    kept: list[pool_rows.PoolRow] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    for r in store.results(run_id):
        line = int(r["position"]) + 1
        if r.get("state") is None:
            problems.append(f"row {line} ({r['row_key']}): no state logged (the adapter logs states with "
                            "SM_SEMIF_LOG_STATES=1)")
        elif r.get("label") is not None:
            problems.append(f"row {line} ({r['row_key']}): already labeled")
        elif (key := pool_rows.state_key(r["state"])) in known:
            problems.append(f"row {line} ({r['row_key']}): this state is already in the labeled set")
        elif key in seen:
            problems.append(f"row {line} ({r['row_key']}): the same state as row {seen[key]}")
        else:
            seen[key] = line
            kept.append(pool_rows.PoolRow(line, r["row_key"], r["state"]))
    if not kept:
        raise PoolProblem(f"run #{run_id}: no unlabeled logged state to pool, nothing saved - "
                          + ("; ".join(problems[:5]) or "the log is empty"))
    pid = pool_store.add(store, name=f"decision log run #{run_id}", policy_id=policy["id"],
                         source=f"decision log run #{run_id}", rows=kept, problems=problems)
    return Imported(pid, len(kept), problems, "")


def check_set(store: Store, set_id: int | None, policy_id: str) -> None:
    """PoolProblem naming --labeled-set when `set_id` is not a labeled set of `policy_id` (its states would be left
    out of the pool and its labels counted for the cold start); None: no set given, nothing to check."""
    if set_id is None:
        return
    base = store.get_labeled_set(set_id)
    if base is None or base["policy_id"] not in (None, policy_id):
        raise PoolProblem(f"--labeled-set {set_id}: not a labeled set of {policy_id!r} - give one of its sets (the "
                          "Calibrate page lists them)")


def get_pool(store: Store, pool_id: int, policy_id: str) -> pool_store.StoredPool:
    found = pool_store.get(store, pool_id)
    if found is None:
        have = ", ".join(f"#{p.id}" for p in pool_store.pools(store, policy_id)) or "none yet"
        raise PoolProblem(f"pool #{pool_id}: no such pool (pools of {policy_id!r}: {have})")
    if found.policy_id != policy_id:
        raise PoolProblem(f"pool #{pool_id} is a pool of policy {found.policy_id!r}, not {policy_id!r} - score it with "
                          "a calibrated policy of that policy, or import the states again for this one")
    return found


# -- the candidate and its stored scores -------------------------------------------------------------
@dataclass(frozen=True)
class Candidate:
    """The calibrated policy that scores and ranks a pool, and its evaluation run (None: not in this
    workbench - the policy file's own request fields are sent)."""
    policy: CalibratedPolicy
    run: Run | None

    def request(self, row: pool_rows.PoolRow, target: Target) -> DecisionRequest:
        """The request the candidate's evaluation sends for this state (runs.resume_evals' rule), so that its
        stored result is what the next calibration would have asked for."""
        if self.run is None:
            return DecisionRequest.model_validate({"id": row.id, "state": row.state, **self.policy.request_fields(),
                                                   "hidden_state": True})
        return pool_rows.request_like(self.run, row.state, row.id, target)

    @property
    def describe(self) -> str:
        how = f"head {self.policy.head.kind}" if self.policy.head is not None else f"correction T={self.policy.temperature:.3g}"
        source = f"run #{self.run['id']}" if self.run is not None else "its own file"
        return f"{self.policy.model.file} · {self.policy.layout} · {how} (as evaluated in {source})"


def candidate(store: Store, policy: CalibratedPolicy) -> Candidate:
    run = store.get_run(policy.run_id) if policy.run_id is not None else None
    if run is not None and (run["kind"] != "eval" or run["policy_id"] != policy.policy_id):
        run = None
    return Candidate(policy, run)


def calibrated_of(store: Store, policy_id: str) -> list[tuple[int, CalibratedPolicy]]:
    """The saved calibrated policies of a policy (Calibrate's exports kept in the workbench), newest first."""
    out = []
    for row in store.list_calibrated():
        if row["policy_id"] != policy_id:
            continue
        try:
            out.append((int(row["id"]), CalibratedPolicy.model_validate(row["config"])))
        except ValueError:  # a file saved by an older workbench that no longer validates: not offered
            continue
    return out


@dataclass(frozen=True)
class Scored:
    run_id: int
    rows: int  # the pool's rows
    reused: int  # already scored and stored: read, not scored again
    evaluated: int  # scored now by the target
    copied: int  # copied from a stored result of the same request (another run, e.g. a calibration)
    errors: int

    @property
    def text(self) -> str:
        return (f"{self.rows} pool rows: {self.reused} stored scores reused, {self.copied} copied from stored results of "
                f"the same model and request, {self.evaluated} scored now" + (f", {self.errors} failed" if self.errors
                                                                              else "") + f" (run #{self.run_id})")


def check_target(cand: Candidate, target: Target) -> None:
    """PoolProblem when the target says it runs another model than the candidate's (a head read on another
    model's hidden states ranks from noise)."""
    try:
        runs_now = target.numerics()
    except TargetError as exc:  # a local model that cannot load: said as the pool's problem, not a traceback
        raise PoolProblem(f"target {target.name!r} cannot score: {exc}; nothing scored") from exc
    if runs_now is not None and runs_now["sha256"] != cand.policy.model.sha256:
        raise PoolProblem(f"target {target.name!r} runs another model ({runs_now['sha256'][:12]}…) than the calibrated "
                          f"policy was made on ({cand.policy.model.file}, {cand.policy.model.sha256[:12]}…): its "
                          "scores would not be this candidate's - pick a target that runs that model; nothing scored")


def score(store: Store, pool: pool_store.StoredPool, cand: Candidate, target: Target,
          progress: ProgressFn | None = None) -> Scored:
    """Every row of the pool scored once by the candidate on `target` and kept (a run of kind 'pool'); a row
    already stored is not scored again. A target that says it runs another model than the candidate's is refused
    (a head read on another model's hidden states ranks from noise)."""
    check_target(cand, target)
    rows = pool_store.rows(store, pool.id)
    run_id = stored_scores(store, pool, cand, target.name)
    if run_id is None:
        run_id = pool_store.start_scores(store, pool, like=cand.run, policy=cand.policy, target=target,
                                         note=f"{pool.label}, scored as {cand.describe}")
    done = store.done_keys(run_id)
    todo = [(i, Case(pool_store.row_key(r), r.state), cand.request(r, target)) for i, r in enumerate(rows)
            if pool_store.row_key(r) not in done]
    counts = {"evaluated": 0, "reused": 0}
    if todo:
        counts = score_into_runs(store, [Job(run_id, target, done=frozenset(done))], todo, total=len(rows),
                                 already=len(rows) - len(todo), progress=progress, reuse=True)[run_id]
    errors = sum(1 for r in store.results(run_id) if r["error"])
    return Scored(run_id, len(rows), len(rows) - len(todo), counts["evaluated"], counts["reused"], errors)


# -- the next rows to label ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Suggested:
    rank: int
    line: int
    id: str
    row_key: str
    state: Any
    proposed: str
    margin: float
    run_id: int
    drawn: bool = False  # drawn at random (the batch's random share), not ranked
    key: float | None = None  # the row's random draw key (draw_keys), kept with its label: Calibrate's pool sample

    @property
    def how(self) -> str:
        """How the row came into the batch, as the page and the command line mark it."""
        return review.RANDOM_DRAW if self.drawn else review.SUGGESTED

    def item(self, option_ids: list[str]) -> review.Item:
        """This row as a review item: labeling it is a review action like every other (who, when, undo); how it was
        picked (drawn at random or suggested) is kept with the label and in the set version's row meta."""
        why = "drawn at random (the unbiased check)" if self.drawn else f"least sure (margin {self.margin:.3f})"
        return review.Item(review.state_key(self.state), self.state, option_ids, self.proposed, 1.0 - self.margin,
                           "pool", f"pool row, line {self.line}: {why}", self.run_id, self.row_key, picked=self.how,
                           draw_key=self.key)


@dataclass(frozen=True)
class Labeled:
    """The labeled rows' hidden states the ranking compares the pool with (its cold start prefers regions of the
    state space none of them covers): those stored for this candidate - by its evaluation run, and by the pool run
    for the pool rows already labeled - read, never scored."""
    X: np.ndarray | None
    found: int  # labeled rows with a stored hidden state of this candidate
    labeled: int  # labeled rows: the set's and the labels pending for it

    @property
    def text(self) -> str:
        if not self.labeled:
            return "no labeled row yet to compare the pool with"
        if self.found:
            return f"compared with the stored hidden states of {self.found} of {self.labeled} labeled rows"
        return (f"the hidden states of the {self.labeled} labeled rows were not available for this candidate (its "
                "evaluation run is not in this workbench, or stored none): the pool rows are compared only with "
                "each other")


@dataclass(frozen=True)
class Ranking:
    rows: list[Suggested]
    open: int  # pool rows not labeled yet (scored or not)
    moved: int  # pool rows already labeled (in the set or pending)
    reused: int  # stored scores read for this ranking
    failed: list[str]
    labeled: Labeled | None = None  # None: the pool has no stored hidden states (probabilities only)
    pending: int = 0  # of `moved`: labeled here, not yet added to the set (Add ... as a new version)

    @property
    def text(self) -> str:
        vs = f"; {self.labeled.text}" if self.labeled is not None else ""
        # labels waiting for "Add ... as a new version" are out of the pool, not in the set yet: said so (it read
        # "40 already labeled and moved to the set" beside "40 labels given, not yet added to a set")
        where = (f", {self.pending} of them not yet added to the set" if self.pending == self.moved else
                 f", {self.pending} of them not yet added to the set, {self.moved - self.pending} in it" if self.pending
                 else " and moved to the set")
        drawn = sum(r.drawn for r in self.rows)
        share = (f"; {drawn} of them drawn at random from the open rows, not ranked (marked random draw: label them "
                 "whatever they look like - they are Calibrate's unbiased check of the gate)" if drawn else "")
        return (f"{len(self.rows)} of {self.open} open pool rows to label next ({self.moved} already labeled{where}); "
                f"ranked from {self.reused} stored scores, no model call{vs}{share}")


def label_counts(store: Store, option_ids: list[str], policy_id: str, set_id: int | None) -> list[int]:
    """Labels per option so far: the set's rows and the labels pending for it (rank's cold start reads them)."""
    labels = [r["label"] for r in store.labeled_rows(set_id)] if set_id is not None else []
    labels += [r["label"] for r in store.reviews(policy_id, pending=True) if r["label"]]
    return [labels.count(o) for o in option_ids]


def labeled_states(store: Store, policy_id: str, set_id: int | None) -> set[str]:
    """State keys that carry a label (not a skip): the set's rows and the labels pending for it."""
    known = {review.state_key(r["state"]) for r in store.labeled_rows(set_id)} if set_id is not None else set()
    return known | {review.state_key(r["state"]) for r in store.reviews(policy_id, pending=True) if r["label"]}


def labeled_vectors(store: Store, cand: Candidate, set_id: int | None, *, pool_results: Iterable[Result] = (),
                    dims: int | None = None) -> Labeled:
    """The stored hidden states of the labeled rows for this candidate: its evaluation run's rows, and the rows
    already labeled of every pool this candidate scored (`pool_results` first: the pool being ranked; all sent as
    the candidate's evaluation sends them, so they are comparable with the pool's) - so a pool file and a stored
    pool are compared with the same labeled rows; `dims`: the pool's vector width (another width is not used)."""
    labeled = labeled_states(store, cand.policy.policy_id, set_id)
    found: dict[str, np.ndarray] = {}
    if cand.run is not None:
        _hidden_of(store.results(int(cand.run["id"])), labeled, found)
    _hidden_of(pool_results, labeled, found)
    if len(found) < len(labeled):
        for run_id in scored_by(store, cand):
            _hidden_of(store.results(run_id), labeled, found)
    kept = [found[key] for key in sorted(found) if dims is None or found[key].shape == (dims,)]  # one order, any path
    return Labeled(np.array(kept) if kept else None, len(kept), len(labeled))


def _hidden_of(results: Iterable[Result], labeled: set[str], found: dict[str, np.ndarray]) -> None:
    for r in results:
        if r["error"] or r.get("state") is None:
            continue
        key = review.state_key(r["state"])
        if key not in labeled or key in found:
            continue
        ref = (StoredResponse.of(r) or NO_RESPONSE).hidden_state
        if ref is not None:
            found[key] = np.asarray(ref.array(), float).ravel()


def order(store: Store, cand: Candidate, P: np.ndarray, X: np.ndarray | None, *, k: int, into_set: int | None,
          pool_results: Iterable[Result] = (), random_share: float = 0.0,
          keys: np.ndarray | None = None) -> tuple[ranking.Batch, Labeled | None]:
    """The ranking of scored pool rows (P: the candidate's probabilities, X: their hidden states or None), the one
    rule of a stored pool and a pool file (`suggest --pool N` and `--pool FILE` rank the same rows alike): label
    counts of the set and its pending labels (the cold start), the labeled rows' stored hidden states; with
    `random_share`, that share of the batch drawn at random from the open rows (app/core/suggest.batch) by `keys`
    (draw_keys of the rows' keys: the same rows are drawn on every rerun of the page and on the command line)."""
    ids = [o.id for o in cand.policy.options]
    labeled = (labeled_vectors(store, cand, into_set, pool_results=pool_results, dims=X.shape[1]) if X is not None
               else None)
    got = ranking.batch(P, k=k, random_share=random_share, X=X,
                        counts=label_counts(store, ids, cand.policy.policy_id, into_set),
                        labeled_X=labeled.X if labeled is not None else None, keys=keys)
    return got, labeled


RANDOM_SHARE = ranking.RANDOM_SHARE  # the page's and the command line's default share of a batch drawn at random
DRAW_SEED = ranking.DRAW_SEED
draw_keys = ranking.draw_keys  # (app/core/suggest: Calibrate's pool sample reads the same keys)


def rank_pool(store: Store, pool: pool_store.StoredPool, cand: Candidate, run_id: int, *, k: int = 20,
              into_set: int | None = None, everything: bool = False, random_share: float = 0.0) -> Ranking:
    """The next k open rows to label, from the stored scores of `run_id` (no model call): the candidate's
    probabilities (its head or correction on the stored reading), ranked by `order` (app/core/suggest.batch), with
    `random_share` of them drawn at random. `everything`: every open scored row, unranked, in file order (what a
    label file may name), those a batch of k with this share draws marked as drawn (the rows `suggest` showed as
    drawn, while no other row was labeled in between), the others as suggested."""
    known = known_states(store, pool.policy_id, into_set)
    waiting = {review.state_key(r["state"]) for r in store.reviews(pool.policy_id, pending=True)}
    stored = {r["row_key"]: r for r in store.results(run_id) if not r["error"] and r.get("probabilities")}
    P, X, kept, failed, moved, pending, open_rows = [], [], [], [], 0, 0, 0
    for row in pool_store.iter_rows(store, pool.id):
        if (key := review.state_key(row.state)) in known:
            moved += 1
            pending += key in waiting
            continue
        open_rows += 1  # not labeled yet, scored or not (a row not scored or not readable is named in `failed`)
        res = stored.get(pool_store.row_key(row))
        if res is None:
            failed.append(f"line {row.line}: not scored (score the pool first)")
            continue
        hidden_ref = (StoredResponse.of(res) or NO_RESPONSE).hidden_state
        hidden = hidden_ref.array() if hidden_ref is not None else None
        try:
            P.append(cand.policy.corrected([float(p) for p in res["probabilities"] or []], hidden))
        except ValueError as exc:
            failed.append(f"line {row.line}: the policy cannot read its stored score ({exc})")
            continue
        X.append(hidden)
        kept.append(row)
    ids = [o.id for o in cand.policy.options]
    if not kept:
        return Ranking([], open_rows, moved, 0, failed, pending=pending)
    Pm = np.array(P)
    m = ranking.margins(Pm)
    labeled = None
    keys = draw_keys([pool_store.row_key(r) for r in kept])
    if everything:  # which of them a batch of k with this share draws: the same rows as the ranking's (its keys)
        d = ranking.draws(min(k, len(kept)), random_share)
        got = ranking.Batch(list(range(len(kept))), frozenset(int(i) for i in np.argsort(keys, kind="stable")[:d]))
    else:
        Xm = np.array(X) if all(x is not None for x in X) else None  # rank() centres / reduces them itself
        got, labeled = order(store, cand, Pm, Xm, k=k, into_set=into_set, pool_results=stored.values(),
                             random_share=random_share, keys=keys)
    rows = [Suggested(i + 1, kept[j].line, kept[j].id, pool_store.row_key(kept[j]), kept[j].state, ids[int(Pm[j].argmax())],
                      float(m[j]), run_id, j in got.drawn, float(keys[j])) for i, j in enumerate(got.rows)]
    return Ranking(rows, open_rows, moved, len(kept), failed, labeled, pending)


def label(store: Store, row: Suggested, option_id: str, *, who: str, policy: CalibratedPolicy, note: str = "") -> int:
    """A pool row labeled (a review action, pending until added to the set as a new version); ValueError
    naming the row when the label is not an option."""
    ids = [o.id for o in policy.options]
    if option_id not in ids:
        raise PoolProblem(f"line {row.line} ({row.id}): label {option_id!r} is not an option ({', '.join(ids)})")
    return review.label(store, row.item(ids), option_id, who=who, note=note, policy_id=policy.policy_id)


def label_rows(store: Store, ranked: Iterable[Suggested], labels: Mapping[str, str], *, who: str,
               policy: CalibratedPolicy) -> int:
    """Labels given as {row id or 'line-N': option} for rows of a ranking, all checked before any is stored
    (one bad label: PoolProblem naming its row, nothing stored). A file's own id that names several rows, or
    one row named twice (by its id and its line-N), is refused: which row is meant is not guessed."""
    named: dict[str, list[Suggested]] = {}
    for r in ranked:
        for key in {r.id, r.row_key}:
            named.setdefault(key, []).append(r)
    ids = [o.id for o in policy.options]
    unknown = [k for k in labels if k not in named]
    if unknown:
        raise PoolProblem(f"row {unknown[0]!r}: not an open row of this pool's ranking - label the rows it suggests "
                          "(their id or line-N)")
    for k in labels:
        if len(named[k]) > 1:
            lines = ", ".join(str(r.line) for r in named[k])
            raise PoolProblem(f"row {k!r}: the id of {len(named[k])} pool rows (lines {lines}) - label them by "
                              "line-N; nothing stored")
    by = {k: named[k][0] for k in labels}
    twice: dict[str, list[str]] = {}
    for k, r in by.items():
        twice.setdefault(r.row_key, []).append(k)
    for keys in twice.values():
        if len(keys) > 1:
            raise PoolProblem(f"line {by[keys[0]].line} is labeled twice ({' and '.join(repr(k) for k in sorted(keys))}) "
                              "- give each row one label; nothing stored")
    bad = [(k, v) for k, v in labels.items() if v not in ids]
    if bad:
        raise PoolProblem(f"row {bad[0][0]!r}: label {bad[0][1]!r} is not an option ({', '.join(ids)}) - nothing stored")
    for k, v in labels.items():
        label(store, by[k], v, who=who, policy=policy)
    return len(labels)


def list_pools(store: Store, policy_id: str | None = None) -> list[pool_store.StoredPool]:
    return pool_store.pools(store, policy_id)


def decision_logs(store: Store, policy_id: str) -> list[tuple[int, str]]:
    """(run id, a label) of the decision logs of a policy already imported - each can become a pool."""
    return [(int(r["id"]), f"run #{r['id']} ({r['n_rows']} decisions, {r['created_at']})")
            for r in store.list_runs(kind="production") if r["policy_id"] == policy_id]


def stored_scores(store: Store, pool: pool_store.StoredPool, cand: Candidate, target_name: str) -> int | None:
    """The pool run already holding this candidate's scores (scored on the candidate's own target), or None. A
    candidate with no evaluation run here matches only a run that sent the same request fields (another
    calibrated file of the policy - another version, readout or layout - asks otherwise)."""
    like = cand.run["id"] if cand.run is not None else None
    asked = pool_store.request_key(cand.policy) if like is None else None
    for run in store.list_runs(kind="pool"):
        cfg = run.get("config") or {}
        if (cfg.get("pool_id") == pool.id and cfg.get("like_run") == like and run["target_name"] == target_name
                and cfg.get("pool_request") == asked):
            return int(run["id"])
    return None


def scoring_note(task: Task | None) -> str:
    """What a pool's finished scoring task did, as its note says it (None: a task the worker no longer keeps)."""
    if task is None:
        return "The scoring ended while you were away (History lists its run); the rows it scored are kept."
    if task.status == "done" and isinstance(task.result, Scored):
        return f"Scored: {task.result.text}."
    if task.status == "stopped" and not task.total:
        return f"Scoring stopped before it started ({task.stop_reason}): nothing was scored."
    if task.status == "stopped":
        return (f"Scoring stopped at {task.done}/{task.total} rows ({task.stop_reason}): the rows scored are kept - "
                "scoring again resumes with the rest; the ranking below reads only the rows scored.")
    return f"Scoring failed: {task.error}"


def scored_by(store: Store, cand: Candidate) -> list[int]:
    """Every pool run holding this candidate's scores (any pool, on the candidate's own target), oldest first."""
    like = cand.run["id"] if cand.run is not None else None
    asked = pool_store.request_key(cand.policy) if like is None else None
    where = target_name(cand)
    return sorted(int(run["id"]) for run in store.list_runs(kind="pool")
                  if (run.get("config") or {}).get("like_run") == like and run["target_name"] == where
                  and (run.get("config") or {}).get("pool_request") == asked)


def unscored(store: Store, pool: pool_store.StoredPool, run_id: int | None) -> int:
    """Pool rows without a stored score in `run_id` (a failed row counts: scoring again retries it); None: all."""
    return pool.n_rows - len(store.done_keys(run_id)) if run_id is not None else pool.n_rows


def target_name(cand: Candidate) -> str:
    """Where the candidate was evaluated (its pool is scored there too): the run's target, else the local engine."""
    return cand.run["target_name"] if cand.run is not None else "local"
