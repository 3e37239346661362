"""`python -m app pool`: unlabeled states kept in the workbench for a policy.

  pool import --policy P (--file F | --log-run N) [--labeled-set S]   a CSV/JSONL (or an imported decision log) as a pool
  pool list [--policy P]                                             the stored pools
  pool label --policy CAL.json --pool N --labels L --labeled-set S    labels for pool rows -> a new version of set S
                                                                     (--k/--random-share as given to suggest: which were drawn)

Rank a stored pool with `python -m app suggest --policy CAL.json --pool N`. Bad input exits 2 with one line
naming the file and row; nothing saved is lost (a rejected import or label file stores nothing)."""
from __future__ import annotations

import argparse
import csv
import getpass
import json

from app.cli import suggest as suggest_cli
from app.cli.common import EXIT_USAGE, UsageProblem, add_db, count, error, left_out, resolve, store
from app.core.store import Store
from app.service import pool as pools
from app.service import review
from app.service import suggest as sg
from app.service.inputs import Ask


def run_import(args: argparse.Namespace) -> int:
    db = store(args)
    policy = resolve(db, Ask(policy=args.policy)).policy  # a bad --policy: exit 2 naming it
    try:
        pools.check_set(db, args.labeled_set, policy["id"])
        got = (pools.import_log(db, policy, args.log_run, into_set=args.labeled_set) if args.log_run is not None else
               pools.import_file(db, policy, args.file, into_set=args.labeled_set, name=args.name or ""))
    except pools.PoolProblem as exc:
        error(exc)
        return EXIT_USAGE
    left_out(got.problems, got.capped)
    print(got.text)
    return 0


def run_list(args: argparse.Namespace) -> int:
    for p in pools.list_pools(store(args), args.policy):
        print(f"#{p.id}\t{p.policy_id}\t{p.n_rows} rows\t{p.source}\t{p.created_at}")
    return 0


def read_labels(path: str) -> dict[str, str]:
    """{row id or line-N: label} from a CSV (columns id, label) or JSONL ({"id", "label"}); UsageProblem naming
    the line that is not one."""
    out: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            if path.lower().endswith(".csv"):
                reader = csv.DictReader(fh)
                if not reader.fieldnames or not {"id", "label"} <= set(reader.fieldnames):
                    raise UsageProblem(f"--labels {path}: line 1: needs the columns id and label; found "
                                       f"{reader.fieldnames or []}")
                recs = [(n, dict(r)) for n, r in enumerate(reader, 2)]
            else:
                recs = []
                for n, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    try:
                        value = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise UsageProblem(f"--labels {path}: line {n}: not valid JSON ({exc.msg})") from None
                    recs.append((n, value if isinstance(value, dict) else {}))
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageProblem(f"--labels {path}: cannot read it ({exc})") from None
    for n, rec in recs:
        ident, label = str(rec.get("id") or "").strip(), str(rec.get("label") or "").strip()
        if not ident or not label:
            raise UsageProblem(f"--labels {path}: line {n}: needs an id (a pool row's id or line-N) and a label")
        if ident in out:
            raise UsageProblem(f"--labels {path}: line {n}: row {ident!r} is labeled twice")
        out[ident] = label
    if not out:
        raise UsageProblem(f"--labels {path}: no label in it")
    return out


def run_label(args: argparse.Namespace) -> int:
    db: Store = store(args)
    labels = read_labels(args.labels)
    try:
        policy = sg.load(args.policy)
        pool = pools.get_pool(db, args.pool, policy.policy_id)
        pools.check_set(db, args.labeled_set, policy.policy_id)
        cand = pools.candidate(db, policy)
        run_id = pools.stored_scores(db, pool, cand, args.target or pools.target_name(cand))
        if run_id is None:
            raise pools.PoolProblem(f"pool #{pool.id} is not scored yet: run `python -m app suggest --policy "
                                    f"{args.policy} --pool {pool.id}` first")
        everything = pools.rank_pool(db, pool, cand, run_id, into_set=args.labeled_set, everything=True,
                                     k=len(labels) if args.k is None else args.k, random_share=args.random_share)
        n = pools.label_rows(db, everything.rows, labels, who=args.who, policy=policy)
        made = review.add_version(db, args.labeled_set, {"id": policy.policy_id})
    except ValueError as exc:
        error(exc)
        return EXIT_USAGE
    drawn = {key for r in everything.rows if r.drawn for key in (r.id, r.row_key)}
    random = sum(k in drawn for k in labels)
    print(f"{n} pool rows labeled by {args.who}" + (f" ({random} of them drawn at random, kept as random draws)"
                                                    if random else "") + f". {made.text}")
    print(f"new set: {made.set_id}")
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("pool", help="unlabeled states kept for a policy: import, list, label into a new set version")
    cmds = p.add_subparsers(dest="pool_cmd", required=True)
    i = cmds.add_parser("import", help="a CSV/JSONL of unlabeled states, or an imported decision log, as a pool")
    i.add_argument("--policy", required=True, help="the policy: a saved id, a template id or a policy JSON file")
    src = i.add_mutually_exclusive_group(required=True)
    src.add_argument("--file", help="CSV (a state column) or JSONL ({'state': ...}) of unlabeled states")
    src.add_argument("--log-run", type=int, help="a decision log already imported (its run id, `app import-log`)")
    i.add_argument("--labeled-set", type=int, help="the labeled set: its states are left out of the pool")
    i.add_argument("--name", help="the pool's name (default: the file's)")
    add_db(i)
    i.set_defaults(fn=run_import)
    ls = cmds.add_parser("list", help="the stored pools")
    ls.add_argument("--policy", help="only this policy's")
    add_db(ls)
    ls.set_defaults(fn=run_list)
    lb = cmds.add_parser("label", help="labels for pool rows, added to a labeled set as a new version")
    lb.add_argument("--policy", required=True, help="the calibrated policy file the pool was ranked with")
    lb.add_argument("--pool", required=True, type=int, help="the stored pool's id")
    lb.add_argument("--labels", required=True, help="CSV (id,label) or JSONL ({'id', 'label'}): id = the row's id (in brackets in "
                    "`suggest`'s list) or line-N for the file's line N")
    lb.add_argument("--labeled-set", required=True, type=int, help="the set the labels are added to (a new version)")
    lb.add_argument("--target", help="the target the pool was scored on (default: where the policy was evaluated)")
    lb.add_argument("--who", default=getpass.getuser(), help="the reviewer stored with every label (default: you)")
    lb.add_argument("--k", type=count, help="the batch size `suggest` ranked with (default: the number of rows in "
                    "--labels, a whole batch): with --random-share, which rows it drew at random - each labeled one "
                    "is kept as a random draw (a smaller k marks fewer, never a ranked row)")
    suggest_cli.add_share(lb)
    add_db(lb)
    lb.set_defaults(fn=run_label)
