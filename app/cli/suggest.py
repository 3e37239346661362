"""`python -m app suggest`: the next rows of an unlabeled pool to label for a calibrated policy - a pool file
(scored now, nothing kept) or a pool stored in the workbench (`--pool 3`, from `python -m app pool import`:
scored once and kept, so the next suggestion and the next calibration reuse every stored score)."""
from __future__ import annotations

import argparse
import re
from pathlib import Path
import sys

from app.cli.common import EXIT_USAGE, add_db, bar, count, error, left_out, share, store, target
from app.core.store import Store
from app.service import pool as pools
from app.service import suggest as sg

STORED = re.compile(r"^(?:pool:|#)?(\d+)$")


def run(args: argparse.Namespace) -> int:
    db = store(args)
    raw = args.pool.strip()
    stored = STORED.match(raw)
    if stored and raw.isdigit() and Path(raw).exists():  # "3": a file named 3, or pool #3?
        if any(p.id == int(raw) for p in pools.list_pools(db)):
            error(f"--pool {raw}: both a file of that name and a stored pool's id - say which: --pool ./{raw} for "
                  f"the file, --pool pool:{raw} for the stored pool")
            return EXIT_USAGE
        stored = None  # no pool of that id: the file
    if stored:
        return run_stored(args, db, int(stored.group(1)))
    try:
        policy, found = sg.read(args.policy, args.pool, db, args.labeled_set)
        pools.check_set(db, args.labeled_set, policy.policy_id)
    except ValueError as exc:
        error(exc)
        return EXIT_USAGE
    left_out(found.problems, found.capped)
    print(f"scoring {len(found.rows)} pool rows with {policy.model.file} ({policy.layout}, "
          f"{policy.correction_name})", file=sys.stderr)
    t = target(db, args.target or pools.target_name(pools.candidate(db, policy)))  # where --pool N scores it too
    try:
        out = sg.suggest(db, policy, found, t, k=args.k, set_id=args.labeled_set, random_share=args.random_share)
    except pools.PoolProblem as exc:
        error(exc)
        return EXIT_USAGE
    for p in out.problems[len(found.problems):]:
        print(f"left out: {p}", file=sys.stderr)
    drawn = sum(s.drawn for s in out.rows)
    print(f"label these {len(out.rows)} of {out.scored} rows next (least sure first; a near-duplicate of a row above "
          "only when too few other rows are left" + (f"; {drawn} drawn at random, marked {DRAWN.strip()}" if drawn else "")
          + "):")
    for s in out.rows:
        print(f"{s.rank:3d}. line {s.line} [{s.id}]{DRAWN if s.drawn else ''} margin {s.margin:.3f}, the policy says "
              f"{s.proposed}: {s.state}")
    if drawn:
        print(DRAWN_NOTE)
    return 0


DRAWN = " (random draw)"
DRAWN_NOTE = ("rows marked (random draw) were drawn at random from the open rows, not ranked: label each whatever it looks "
              "like - on Calibrate they are the check of the gate that does not lean low (a stored pool remembers them "
              "as drawn when labeled with `pool label` and the same --k and --random-share)")


def run_stored(args: argparse.Namespace, db: Store, pool_id: int) -> int:
    """A stored pool: scored once (what is stored is read, not scored again), ranked from the stored scores."""
    try:
        policy = sg.load(args.policy)
        pool = pools.get_pool(db, pool_id, policy.policy_id)
        pools.check_set(db, args.labeled_set, policy.policy_id)
    except ValueError as exc:
        error(exc)
        return EXIT_USAGE
    cand = pools.candidate(db, policy)
    t = target(db, args.target or pools.target_name(cand))
    print(f"{pool.label}: scoring with {cand.describe} on {t.name}", file=sys.stderr)
    b = bar(pool.n_rows, args.quiet)
    try:
        scored = pools.score(db, pool, cand, t, b.progress)
    except pools.PoolProblem as exc:
        error(exc)
        return EXIT_USAGE
    finally:
        b.close()
    print(scored.text, file=sys.stderr)
    ranked = pools.rank_pool(db, pool, cand, scored.run_id, k=args.k, into_set=args.labeled_set,
                             random_share=args.random_share)
    for p in ranked.failed[:20]:
        print(f"left out: {p}", file=sys.stderr)
    print(ranked.text + ":")
    for s in ranked.rows:
        text = s.state if isinstance(s.state, str) else str(s.state)
        print(f"{s.rank:3d}. line {s.line} [{s.id}]{DRAWN if s.drawn else ''} margin {s.margin:.3f}, the policy says "
              f"{s.proposed}: {text[:200]}")
    if any(s.drawn for s in ranked.rows):
        print(DRAWN_NOTE)
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("suggest", help="rank an unlabeled pool's rows for labeling under a calibrated policy")
    p.add_argument("--policy", required=True, help="a calibrated policy file (semif-policy/1, from Calibrate)")
    p.add_argument("--pool", required=True, help="CSV (a 'state' column) or JSONL ({'state': ...}) of unlabeled rows, "
                   "or a stored pool's id (3, #3 or pool:3; `python -m app pool import`); a file named like an id: ./3")
    p.add_argument("--k", type=count, default=20, help="how many rows to suggest (default 20)")
    add_share(p)
    p.add_argument("--labeled-set", type=int, help="a labeled set id: its states are left out of the pool")
    p.add_argument("--target", help="target name (default: the target the policy was evaluated on when its run is "
                   "in this workbench, else the local engine)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_db(p)
    p.set_defaults(fn=run)


def add_share(p: argparse.ArgumentParser) -> None:
    p.add_argument("--random-share", type=share, default=pools.RANDOM_SHARE, metavar="R",
                   help="the share of each batch drawn at random from the open rows instead of ranked (round(R*k), "
                   f"halves up; 0 to 1, default {pools.RANDOM_SHARE:g}): labeled, those rows give Calibrate a check "
                   "of the gate that does not lean low")
