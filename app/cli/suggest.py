"""`python -m app suggest`: the next rows of an unlabeled pool to label for a calibrated policy."""
from __future__ import annotations

import argparse
import sys

from app.cli.common import EXIT_USAGE, add_db, count, error, store, target
from app.service import suggest as sg


def run(args: argparse.Namespace) -> int:
    db = store(args)
    try:
        policy, found = sg.read(args.policy, args.pool, db, args.labeled_set)
    except ValueError as exc:
        error(exc)
        return EXIT_USAGE
    for p in found.problems[:20]:
        print(f"left out: {p}", file=sys.stderr)
    if len(found.problems) > 20:
        print(f"left out: {len(found.problems) - 20} more rows", file=sys.stderr)
    if found.capped:
        print(f"capped: {found.capped}", file=sys.stderr)
    print(f"scoring {len(found.rows)} pool rows with {policy.model.file} ({policy.layout}, "
          f"{policy.correction_name})", file=sys.stderr)
    out = sg.suggest(policy, found, target(db, args.target), k=args.k)
    for p in out.problems[len(found.problems):]:
        print(f"left out: {p}", file=sys.stderr)
    print(f"label these {len(out.rows)} of {out.scored} rows next (least sure first; options short of labels first; "
          "no near-duplicates):")
    for s in out.rows:
        print(f"{s.rank:3d}. line {s.line} [{s.id}] margin {s.margin:.3f}, the policy says {s.proposed}: {s.state}")
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("suggest", help="rank an unlabeled pool's rows for labeling under a calibrated policy")
    p.add_argument("--policy", required=True, help="a calibrated policy file (semif-policy/1, from Calibrate)")
    p.add_argument("--pool", required=True, help="CSV (a 'state' column) or JSONL ({'state': ...}) of unlabeled rows")
    p.add_argument("--k", type=count, default=20, help="how many rows to suggest (default 20)")
    p.add_argument("--labeled-set", type=int, help="a labeled set id: its states are left out of the pool")
    p.add_argument("--target", default="local", help="target name (default: the local engine)")
    add_db(p)
    p.set_defaults(fn=run)
