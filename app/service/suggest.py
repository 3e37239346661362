"""`python -m app suggest`: which rows of an unlabeled pool to label next for a calibrated policy. Each pool
row is scored once by the target with the policy's own rendering (its layout, readout, correction; with the
hidden state its head reads), the policy's probabilities taken through its one rule
(CalibratedPolicy.corrected: its head, or temperature and offsets), and the rows ranked by app/service/pool.order
- the stored pool's rule: the request its evaluation run sends when that run is in the workbench, the label
counts of `--labeled-set` and its pending labels (the cold start), the labeled rows' stored hidden states - so a
file and the same rows imported as a pool (`--pool N`) are ranked alike."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from adapter.policy import CalibratedPolicy, PolicyError, load_policy

from app.core import pool as pool_rows
from app.core import pool_store
from app.core import suggest as ranking
from app.service import pool as pools
from app.core.store import Store
from app.targets.base import Target


@dataclass(frozen=True)
class Suggested:
    rank: int
    line: int
    id: str
    state: str
    proposed: str  # the option the policy's probabilities prefer
    margin: float
    drawn: bool = False  # drawn at random (the batch's random share), not ranked


@dataclass
class Suggestion:
    rows: list[Suggested]
    scored: int
    problems: list[str]
    capped: str


def load(policy_path: str) -> CalibratedPolicy:
    """A calibrated policy file; ValueError naming it."""
    try:
        return load_policy(Path(policy_path), what=f"--policy {policy_path}")
    except PolicyError as exc:
        raise ValueError(str(exc)) from None


def read(policy_path: str, pool_path: str, store: Store, set_id: int | None) -> tuple[CalibratedPolicy, pool_rows.Pool]:
    """The calibrated policy and the pool's usable rows; ValueError naming the file, or the first problems."""
    policy = load(policy_path)
    known = pools.known_states(store, policy.policy_id, set_id)  # what a stored pool leaves out too
    try:
        with open(pool_path, encoding="utf-8") as fh:
            found = pool_rows.read_pool(fh, pool_path, [o.id for o in policy.options], policy.policy_id, known=known)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--pool {pool_path}: cannot read it ({exc})") from None
    if not found.rows:
        raise ValueError(f"--pool {pool_path}: no usable row" + (": " + "; ".join(found.problems[:5]) if found.problems
                                                                 else " (an empty file)"))
    return policy, found


def suggest(store: Store, policy: CalibratedPolicy, found: pool_rows.Pool, target: Target, *, k: int = 20,
            set_id: int | None = None, random_share: float = 0.0) -> Suggestion:
    cand = pools.candidate(store, policy)
    pools.check_target(cand, target)
    P, X, kept, problems = [], [], [], list(found.problems)
    for row in found.rows:
        answer = target.decide(cand.request(row, target))
        if not answer.ok or answer.result is None:
            problems.append(f"line {row.line}: the target failed on it ({answer.error})")
            continue
        r = answer.result
        hidden = r.hidden_state.array() if r.hidden_state is not None else None
        try:
            P.append(policy.corrected(list(r.probabilities), hidden))
        except ValueError as exc:
            problems.append(f"line {row.line}: the policy cannot read it ({exc})")
            continue
        X.append(hidden)
        kept.append(row)
    if not kept:
        return Suggestion([], 0, problems, found.capped)
    Pm = np.array(P)
    Xm = np.array(X) if all(x is not None for x in X) else None
    got, _ = pools.order(store, cand, Pm, Xm, k=k, into_set=set_id, random_share=random_share,
                         keys=pools.draw_keys([pool_store.row_key(r) for r in kept]))
    m = ranking.margins(Pm)
    ids = [o.id for o in policy.options]
    rows = [Suggested(i + 1, kept[j].line, kept[j].id, str(kept[j].state)[:200], ids[int(Pm[j].argmax())], float(m[j]),
                      j in got.drawn) for i, j in enumerate(got.rows)]
    return Suggestion(rows, len(kept), problems, found.capped)
