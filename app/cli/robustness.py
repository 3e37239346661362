"""`python -m app robustness`: the Robustness check headless - the same rows, rates and verdicts as
the page, as JSON."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from adapter.guard import GUARDS

from app.cli.common import (EXIT_USAGE, UsageProblem, add_db, add_mapping, bar, columns, count, error, out_file, resolve,
                            store)
from app.service import checks
from app.service.checks import CHECK_LABELS, CHECKS, InputError, SuiteError
from app.service.decide import read_file
from app.service.inputs import Ask


def run(args: argparse.Namespace) -> int:
    db = store(args)
    if bool(args.labeled_set) == bool(args.states):
        raise UsageProblem("give exactly one of --labeled-set (a labeled set) or --states (a CSV/JSONL of states)")
    given = resolve(db, Ask(args.policy, labeled_set=args.labeled_set, set_cases=True, states=args.states,
                            limit=args.limit, columns=columns(args), calibrated=(args.calibrated,) if args.calibrated else (),
                            targets=(args.target,)))
    policy, cases, pick, t = given.policy, given.cases, given.pick, given.target
    try:
        suite = checks.shipped_suite(policy)
        if args.templates:
            suite.steering += checks.parse_templates(_text(read_file(args.templates, "--templates"), "--templates"))
        suite.paraphrases += args.paraphrase or []
        out_of_scope = (checks.out_of_scope_states(Path(args.out_of_scope).name, read_file(args.out_of_scope, "--out-of-scope"))
                        if args.out_of_scope else [])
        guard = args.guard or (pick.guard if pick is not None else "none")  # a calibrated policy's own, as deployed
        spec = checks.RobustnessInput.of(given, suite, args.checks or list(CHECKS), attempts=args.attempts,
                                         variant=args.readout, guard=guard, out_of_scope=out_of_scope)
        how = (f"as deployed: {pick.describe()}" + (f"; what-if guard {guard}" if guard != pick.guard else "")
               if pick else f"{args.readout}, guard {guard}")
        print(f"robustness: {policy['id']} x {len(cases)} states x target {t.name} ({how})", file=sys.stderr)
        b = bar(0, args.quiet)
        try:
            run_id = checks.robustness_check(db, spec, t, progress=b.progress)
        finally:
            b.close()
    except (InputError, SuiteError, OSError) as exc:  # SuiteError: also a calibrated policy that cannot be used here
        error(exc)
        return EXIT_USAGE
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None
    report = checks.robustness_report(db, run_id)
    if not report.verdicts:  # a CI job must never read "nothing was checked" as green
        error(f"no check ran (asked for {', '.join(spec.checks)} on {len(cases)} states): nothing was judged - give "
              "states the checks apply to (e.g. --out-of-scope for none-of-these), or other --checks")
        return EXIT_USAGE
    for check, (level, text) in report.verdicts.items():
        print(f"[{level.upper():4}] {CHECK_LABELS[check]}: {text}")
    if (what_if := checks.what_if(report)) is not None:
        print(f"[INFO] {what_if}")
    for check, why in (report.summary.head.not_applied if report.summary.head is not None else {}).items():
        print(f"[INFO] {CHECK_LABELS[check]}: the learned head does not apply ({why}): the model's numbers alone")
    if args.json:
        Path(args.json).write_text(json.dumps({"run": run_id, **report.summary.to_json()}, indent=2, ensure_ascii=False) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _text(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError([f"{what}: not UTF-8 text - save it as UTF-8"]) from None


def check_names(text: str) -> list[str]:
    """--checks: known check names, comma-separated, at least one (argparse: exit 2 naming the unknown ones)."""
    names = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in names if c not in CHECKS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{', '.join(map(repr, unknown)) or 'no check'}: not a check - give a "
                                         f"comma-separated subset of {','.join(CHECKS)}")
    return list(dict.fromkeys(names))


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("robustness", help="steering, paraphrase, renamed/extra options, order: does the decision hold?")
    p.add_argument("--policy", required=True, help="saved policy id, template id, or JSON file")
    p.add_argument("--labeled-set", help="CSV/JSONL file (or a file name in data/labeled), or a set id")
    p.add_argument("--states", help="CSV/JSONL with a state column (labels optional)")
    add_mapping(p, "--labeled-set or --states")
    p.add_argument("--target", default="local", help="target name (default: the local engine)")
    p.add_argument("--limit", type=count, default=20, help="at most N states, evenly spaced (default 20)")
    p.add_argument("--attempts", type=count, default=3, help="steering attempts per state (default 3)")
    p.add_argument("--checks", type=check_names, help=f"comma-separated subset of {','.join(CHECKS)} (default: all); "
                   "an unknown name is a usage error (exit 2)")
    p.add_argument("--readout", default="default", help="readout variant, as on the Calibrate page (default: default)")
    p.add_argument("--guard", choices=list(GUARDS),
                   help="the steering guard on the unchanged and the steered rows (default: none; with --calibrated "
                        "the policy's own, and another is reported as a what-if beside it)")
    p.add_argument("--calibrated", metavar="ID_OR_FILE",
                   help="a calibrated policy of this policy (a saved id, or a semif-policy file), tested as deployed: "
                        "its readout, correction or learned head, guard, gate and fallback")
    p.add_argument("--templates", help="a text file of your own steering templates, one per line, each with {option}")
    p.add_argument("--paraphrase", action="append", help="a rewording of the question; repeat")
    p.add_argument("--out-of-scope", help="CSV/JSONL of states that fit no option (for the none-of-these check)")
    p.add_argument("--json", type=out_file, help="write the summary (hijack_rate, still_correct_rate, flip_rate, n, ...) here")
    p.add_argument("--quiet", action="store_true")
    add_db(p)
    p.set_defaults(fn=run)
