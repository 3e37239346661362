"""`python -m app check`: the CI gate - exit 0 when every threshold holds, 1 when one fails, 2 for a
usage or target error; JUnit XML and Markdown on request (app/service/ci_check.py)."""
from __future__ import annotations

import argparse
import sys

from adapter.schema import DEBIAS, READOUTS

from app.cli.common import EXIT_USAGE, UsageProblem, add_db, count, error, out_file, rate, store
from app.service import ci_check as cc


def run(args: argparse.Namespace) -> int:
    spec = cc.CheckInput(args.policy, args.labeled_set, {k: getattr(args, k) for k in cc.BOUNDS}, baseline=args.baseline,
                         gate=args.gate, readout=args.readout, debias=args.debias, permute=args.permute,
                         reuse=not args.no_reuse)
    db = store(args)
    try:
        result = cc.check(db, spec, cc.resolve(db, spec, args.target))
    except (cc.UsageError, UsageProblem) as exc:
        error(exc)
        return EXIT_USAGE
    ctx = result.report.context
    print(f"check run #{result.run_id}: {ctx['rows']} rows, {ctx['evaluated']} evaluated, {ctx['reused']} reused from "
          "stored results of the same model and request", file=sys.stderr)
    if evidence := ctx.get("gate_evidence"):
        print(f"the policy's gate, as Calibrate chose it: {evidence}", file=sys.stderr)
    if checked := ctx.get("gate_check"):
        print(f"the gate on the pool's random sample, as Calibrate checked it: {checked}", file=sys.stderr)
    for o in result.report.outcomes:
        print(f"[{'PASS' if o.passed else 'FAIL'}] --{o.name}: {o.message}")
    try:
        cc.write_reports(db, result, junit=args.junit, summary=args.summary)
    except OSError as exc:
        error(f"cannot write the report: {exc}")
        return EXIT_USAGE
    return result.exit_code


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("check", help="CI gate: evaluate a policy and fail when a threshold does not hold (exit 0/1/2)",
                       description="Exit 0 when every threshold holds, 1 when one fails, 2 for a usage or target error.")
    p.add_argument("--policy", required=True, help="a calibrated policy file (semif-policy/1: its gate is used), or a "
                   "saved policy id / template id / policy JSON")
    p.add_argument("--labeled-set", required=True, help="CSV/JSONL file (or a file name in data/labeled), or a set id")
    p.add_argument("--target", default="local", help="target name (default: the local engine)")
    p.add_argument("--min-accuracy", type=rate, help="accuracy of the top option over all labeled rows, before the gate")
    p.add_argument("--min-gate-accuracy", type=rate, help="accuracy of the rows the gate decides")
    p.add_argument("--min-coverage", type=rate, help="share of rows the gate decides (not sent to the fallback)")
    p.add_argument("--max-ece", type=rate, help="expected calibration error of the confidence the gate reads")
    p.add_argument("--baseline", help="a run id (History) or 'pinned', for --max-flips / --max-broken")
    p.add_argument("--max-flips", type=count, help="rows whose top option changed against the baseline")
    p.add_argument("--max-broken", type=count, help="rows right in the baseline and wrong now")
    p.add_argument("--gate", type=rate, help="with a plain policy: decide when the top probability >= this")
    p.add_argument("--readout", choices=list(READOUTS), help="plain policy: default the policy's / model's")
    p.add_argument("--debias", choices=list(DEBIAS), help="plain policy: default the policy's / model's")
    p.add_argument("--permute", action="store_true", help="plain policy: permutation averaging")
    p.add_argument("--junit", metavar="FILE", type=out_file, help="write JUnit XML: one test case per threshold")
    p.add_argument("--summary", metavar="FILE", type=out_file, help="write Markdown for a pull-request comment")
    p.add_argument("--no-reuse", action="store_true", help="score every row even when a stored result would do")
    add_db(p)
    p.set_defaults(fn=run)
