"""`python -m app registry ...`: calibrated policies in the MLflow model registry (SEMIF_MLFLOW_TRACKING_URI).

  register --calibrated ID|FILE   a new version of semif-<policy id>, aliased @candidate
  promote NAME [--version V]      @production -> the candidate, after the shadow check (replayed rows through
                                  both: flips, shifts, McNemar); beyond --tolerance it asks (or --yes)
  rollback NAME                   @production back to the version before the last promotion
  list [NAME]                     versions and aliases
  resolve REF                     models:/NAME@ALIAS or models:/NAME/VERSION -> a validated policy file
  shadow-plan NAME --model GGUF   a dry-run SageMaker plan: @production with @candidate as a shadow variant
  flush                           send the runs still waiting for the tracker

NAME is the registered model (semif-ticket-routing) or the policy id (ticket-routing). Exit 2 for bad input
or an unreachable tracker, 1 when a promotion was not confirmed."""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from app.cli.common import EXIT_FAILED, EXIT_USAGE, add_db, error, rate, store
from app.core.store import Store
from app.service import registry as reg
from app.service import tracking as tracked


def run(args: argparse.Namespace) -> int:
    db = store(args)
    try:
        if args.action == "register":
            got = reg.register(db, args.calibrated)
            print(f"{got.name} v{got.version} @{reg.CANDIDATE}" + ("" if got.new else " (already registered: the same "
                  "policy file)") + f" - promote it with: python -m app registry promote {got.name}")
        elif args.action == "promote":
            return promote(db, args)
        elif args.action == "rollback":
            back = reg.rollback(db, args.name)
            print(f"{back.name} @{reg.PRODUCTION}: v{back.previous} -> v{back.version}")
        elif args.action == "list":
            for e in reg.listing(args.name):
                print(f"{e.name} v{e.version} {' '.join('@' + a for a in e.aliases):24} {e.model_file} {e.registered_at}")
            if args.name:
                for line in reg.audit(db, args.name):
                    print(f"  audit: {line}")
        elif args.action == "resolve":
            found = reg.resolve(args.ref, store=db)
            print(found.path)
            print(f"{found.ref} -> {found.name} v{found.version} ({found.policy.model.file}, "
                  f"{found.policy.model.sha256[:12]})", file=sys.stderr)
        elif args.action == "shadow-plan":
            cfg, steps, problems = reg.shadow_plan(db, args.name, model=args.model, work_dir=Path(args.work_dir))
            print(json.dumps({"endpoint": cfg.endpoint_name, "calls": [{"n": i, "call": f"{s.service}.{s.operation}",
                              "why": s.description, "params": s.params} for i, s in enumerate(steps, 1)]}, indent=2))
            if problems:
                error("the plan is invalid:\n  " + "\n  ".join(problems))
                return EXIT_USAGE
        elif args.action == "flush":
            sent, waiting = tracked.flush(db)
            print(f"sent {sent}; waiting {waiting}")
            return 0 if not waiting else EXIT_FAILED
    except reg.RegistryError as exc:
        error(exc)
        return EXIT_USAGE
    return 0


def interactive() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (OSError, ValueError):  # a closed or replaced stdin: nobody to ask
        return False


def promote(db: Store, args: argparse.Namespace) -> int:
    try:
        got = reg.promote(db, args.name, version=args.version, replay=args.replay, tolerance=args.tolerance,
                          confirm=args.yes)
    except reg.NeedsConfirmation as exc:
        for row in (exc.shadow.examples if exc.shadow else []):
            print(f"  {row['row']}: production {row['production']} -> candidate {row['candidate']} "
                  f"(label {row['label']})", file=sys.stderr)
        if not interactive():
            error(f"{exc} (give --yes to promote anyway)")
            return EXIT_FAILED
        print(f"{exc}", file=sys.stderr)
        if input("promote anyway? [y/N] ").strip().lower() not in ("y", "yes"):
            print("not promoted", file=sys.stderr)
            return EXIT_FAILED
        got = reg.promote(db, args.name, version=args.version, replay=args.replay, tolerance=args.tolerance,
                          confirm=True)
    if got.shadow is not None:
        print(f"shadow check: {got.shadow.text()}")
    if got.note:
        print(f"note: {got.note}")
    print(f"{got.name} @{reg.PRODUCTION}: v{got.previous or '-'} -> v{got.version}")
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("registry", help="calibrated policies in the MLflow model registry: register, promote, rollback",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    acts = p.add_subparsers(dest="action", required=True)
    r = acts.add_parser("register", help="a calibrated policy as a new version (@candidate)")
    r.add_argument("--calibrated", required=True, help="a saved calibrated policy id (3, #3) or a semif-policy file")
    pr = acts.add_parser("promote", help="@production -> the candidate, after the shadow check")
    pr.add_argument("name")
    pr.add_argument("--version", help="promote this version instead of @candidate")
    pr.add_argument("--replay", type=int, help="the run whose stored rows are replayed (default: the newest production "
                                               "log of the policy, else its newest evaluation)")
    pr.add_argument("--tolerance", type=rate, default=reg.DEFAULT_TOLERANCE,
                    help=f"share of replayed decisions that may change without asking (default {reg.DEFAULT_TOLERANCE})")
    pr.add_argument("--yes", action="store_true", help="promote even beyond the tolerance (recorded as confirmed)")
    rb = acts.add_parser("rollback", help="@production back to the version before the last promotion")
    rb.add_argument("name")
    ls = acts.add_parser("list", help="versions and aliases (with NAME: its audit log too)")
    ls.add_argument("name", nargs="?")
    rs = acts.add_parser("resolve", help="a models:/ reference -> a validated policy file (its path on stdout)")
    rs.add_argument("ref")
    sp = acts.add_parser("shadow-plan", help="a dry-run SageMaker plan: @production with @candidate as its shadow "
                                             "variant (ShadowProductionVariants), packaged and validated offline")
    sp.add_argument("name")
    sp.add_argument("--model", required=True, help="the GGUF both versions were calibrated on")
    sp.add_argument("--work-dir", default=str(Path(tempfile.gettempdir()) / "semif-deploy"))
    fl = acts.add_parser("flush", help="send the runs still waiting for the tracker")
    for q in (r, pr, rb, ls, rs, sp, fl):
        add_db(q)
    p.set_defaults(fn=run)
