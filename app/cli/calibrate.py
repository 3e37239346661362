"""`python -m app calibrate`: evaluate a policy on a labeled set, print metrics and the gate, export."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from adapter.guard import GUARDS
from adapter.schema import DEBIAS, HEAD_LAYOUT, LAYOUTS, READOUTS

from app.cli.common import (EXIT_BUSY, EXIT_UNREACHABLE, EXIT_USAGE, add_db, add_mapping, bar, columns, count, error,
                            fmt, option_id, out_file, rate, resolve, store, target_rate)
from app.core.runs import EXAMPLE_SOURCES, HEAD_VARIANT, Variant
from app.core.store import RunBusy
from app.service import calibrate_panels, checks, export_candidate, label_curve
from app.service import evaluate as ev
from app.service import tracking as tracked
from app.service.inputs import Ask
from app.targets.engines import EnginePool


def run(args: argparse.Namespace) -> int:
    db = store(args)
    if args.layout == HEAD_LAYOUT and (args.readout or args.debias or args.permute):
        error("--layout policy-first reads letters with no correction and no permutation: drop --readout, "
              "--debias and --permute")
        return EXIT_USAGE
    # One pool for the target and its head sources (issue 45: not a model per target). The sources are scored
    # source by source, so one model resident is enough here unless SEMIF_MAX_LOADED_MODELS says otherwise:
    # three head sources measured 5.9 GB peak RSS before, 3.2 GB with two resident, 2.4 GB with one.
    pool = EnginePool(max_loaded=None if os.environ.get("SEMIF_MAX_LOADED_MODELS") else 1)
    names = tuple(name.strip() for name in (args.head_sources or "").split(",") if name.strip())
    given = resolve(db, Ask(args.policy, labeled_set=args.labeled_set, columns=columns(args), targets=(args.target,),
                            head_sources=names, pool=pool))
    policy, set_id, t, readers = given.policy, given.set_id, given.target, list(given.head_sources)
    assert set_id is not None
    variant = HEAD_VARIANT if args.layout == HEAD_LAYOUT else Variant(args.readout, args.debias, args.permute)
    print(f"policy {policy['id']} x set #{set_id} x target {t.name} ({variant.name})", file=sys.stderr)
    b = bar(0, args.quiet)
    try:
        outcome = ev.evaluate_one(db, policy, set_id, t, variant, examples=args.examples, n_examples=args.n_examples,
                                  new_run=args.new_run, progress=b.progress, head_sources=readers)
    except RunBusy as exc:
        error(exc)
        return EXIT_BUSY
    except ValueError as exc:  # e.g. the set's labels are not this policy's options
        error(exc)
        return EXIT_USAGE
    finally:
        b.close()
    c = outcome.counts
    print(f"run #{outcome.run_id} ({'resumed' if outcome.resumed else 'new'}): scored {c['scored']} rows "
          f"({c['evaluated']} evaluated, {c['reused']} copied from stored results of the same model and request), "
          f"reused {c['skipped']} already in this run, errors {c['errors']}"
          + (f". {outcome.why_scored}" if outcome.why_scored else ""), file=sys.stderr)
    assert outcome.run_id is not None
    try:
        cal = ev.calibrate(db, outcome.run_id, target_accuracy=args.target_accuracy, per_option=args.per_option,
                           head=args.head)
    except ValueError as exc:  # too few usable rows, or --head naming a head these rows cannot support
        error(exc)
        return EXIT_USAGE
    rep = cal.report
    print(f"rows {rep.n} ({rep.size_flag}) accuracy {rep.accuracy:.3f} macro-F1 {rep.macro_f1:.3f} "
          f"Brier {rep.brier:.3f} NLL {rep.nll:.3f}")
    print(f"correction {cal.correction_why}")
    for row in calibrate_panels.candidate_table(cal):
        if row.kind == "learned head":
            print(f"  {row.candidate}: " + (f"accuracy {row.accuracy_ci}; macro-F1 {fmt(row.macro_f1)}, "
                                            f"{row.macro_f1_ci}; ECE {fmt(row.ece)}, {row.ece_ci}; {row.detail}"
                                            if row.accuracy is not None else f"unavailable: {row.note}"))
    print(f"learned head: {cal.head_why}")
    if readers and (table := ev.sources(db, outcome.run_id)) is not None:
        print("sources (out of fold, on the rows every source answered):")
        for source in table.rows:
            cand, a = source.candidate, source.accuracy
            acc = (f"accuracy {fmt(a.rate)} ({a.low:.1%}–{a.high:.1%}), {fmt(cand.seconds)} s a row"
                   if a is not None and a.low is not None and a.high is not None else f"refused: {cand.refused}")
            print(f"  run #{cand.run_id} {cand.model} · {ev.layout_words(cand.layout)} · {cand.method}: {acc}"
                  + (" [recommended]" if source is table.recommended else ""))
        print(table.sentence)
    if args.export != "target":
        try:
            picked = export_candidate.pick(ev.sources(db, outcome.run_id), args.export)
            cal = export_candidate.calibrate(db, picked, target_accuracy=args.target_accuracy, per_option=args.per_option)
        except ValueError as exc:
            error(exc)
            return EXIT_USAGE
        rep = cal.report
        print(f"exporting {picked.label} (run #{picked.run_id}, --export {export_candidate.spec_of(picked.row.candidate)}):"
              f" {cal.chosen_name} fitted on all {rep.n} labeled rows")
    after = cal.chosen_name + ("" if cal.head is not None else f" T={rep.temperature:.3f}")
    print(f"ECE (10 equal-width bins) {rep.ece_width:.3f} -> {rep.oof_ece_width:.3f} after {after} "
          f"(out of fold); equal-mass {rep.ece_mass:.3f} -> {rep.oof_ece_mass:.3f}")
    exported = ev.export(db, cal, fallback=args.fallback, hand_gate=args.gate, guard=args.guard)
    guard = exported.policy.guard
    print(f"steering guard: {guard}" + (" - turned off (--guard none); what that costs:" if guard == "none" else
                                       " (--guard none turns it off); what it holds and costs:"))
    for line in checks.guard_cost(db, exported.policy.policy_id):
        print(f"  {line}")
    for line in exported.gate.messages:
        print(line)
    if exported.gate.source == "hand-set":
        print(f"gate set by hand: {exported.gate.threshold:.3f}")
    at = exported.at_gate
    print(f"exported rule on all {at.n} rows{' (out of fold: the head never saw the row it decides)' if cal.head else ''}: "
          f"decides {at.decided} (coverage {fmt(at.coverage)}), accuracy {fmt(at.accuracy)}, {at.gated} to "
          f"fallback {args.fallback!r}")
    if oof := exported.policy.metrics.at_gate_out_of_fold:
        print(f"the same rule out of fold (each row corrected by a fit without it): decides {oof.decided} "
              f"(coverage {fmt(oof.coverage)}), accuracy {fmt(oof.accuracy)}")
    for warning in calibrate_panels.warnings(exported):
        print(f"warning: {warning}")
    if args.learning_curve:  # printed, and carried by the file (metrics.label_curve, the last gate note)
        curve = label_curve.label_curve(cal)
        print("what more labels buy: " + curve.sentence)
        exported = label_curve.with_curve(exported, curve)
    if args.out:
        try:  # checked before scoring (common.out_file); the folder may still change meanwhile
            Path(args.out).write_text(json.dumps(exported.to_json(), indent=2, ensure_ascii=False) + "\n")
        except OSError as exc:
            error(f"--out {args.out}: cannot write it ({exc.strerror or exc}); the run is saved (#{outcome.run_id}): "
                  "run the command again with another --out to export it without scoring again")
            return EXIT_USAGE
        print(f"wrote {args.out}", file=sys.stderr)
    # logged last: the policy as written (learning curve included); nothing is logged when --out could not be written
    if (logged := tracked.calibration(db, exported.to_json())) is not None:  # SEMIF_MLFLOW_TRACKING_URI set
        print(f"MLflow: {tracked.sent_text(logged)}", file=sys.stderr)
    return EXIT_UNREACHABLE if (args.strict and exported.gate.source == "unreachable") else 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("calibrate", help="evaluate a policy on a labeled set and export a calibrated policy")
    p.add_argument("--policy", required=True, help="saved policy id, template id, or JSON file")
    p.add_argument("--labeled-set", required=True, help="CSV/JSONL file (or a file name in data/labeled), or a set id")
    add_mapping(p, "--labeled-set")
    p.add_argument("--target", default="local", help="target name (default: the local engine)")
    p.add_argument("--readout", choices=list(READOUTS), help="default: the policy's / model's")
    p.add_argument("--debias", choices=list(DEBIAS), help="default: the policy's / model's")
    p.add_argument("--permute", action="store_true", help="permutation averaging")
    p.add_argument("--layout", choices=list(LAYOUTS), default="state-first",
                   help="policy-first: the head layout (the policy cached, each row reads its state), read only by "
                        "a learned head - the export then carries a hidden-state head for this target's model")
    p.add_argument("--head-sources", help="comma-separated local targets whose hidden states in the head layout are "
                                          "read beside the target, row by row; prints which (model, layout, head) "
                                          "is cheapest without being worse beyond noise")
    p.add_argument("--examples", choices=EXAMPLE_SOURCES, default="policy",
                   help="few-shot examples from the policy, or from the set's train split")
    p.add_argument("--n-examples", type=count, default=4)
    p.add_argument("--target-accuracy", type=target_rate, default=0.9, help="above 0, at most 1 (default 0.9)")
    p.add_argument("--gate", type=rate, help="set the confidence gate by hand instead of from the target (0-1)")
    p.add_argument("--per-option", action="store_true", help="also fit one gate per option")
    p.add_argument("--head", choices=ev.HEAD_CHOICES, default="auto",
                   help="learned head: auto (exported only when it beats the corrections beyond noise), none, or a "
                        "kind to export whatever its gain (linc: on the log-probs; hidden: on the hidden state; "
                        "stacked: both)")
    p.add_argument("--export", default="target", metavar="WHICH",
                   help="which candidate of the sources table the file carries: target (default: the evaluated target's "
                        "run), recommended, best, or MODEL:LAYOUT:METHOD (e.g. qwen2.5-coder-0.5b-instruct-q4_k_m:"
                        "policy-first:hidden) - its model (sha256), layout and head, fitted on all labeled rows")
    p.add_argument("--learning-curve", action="store_true",
                   help="also print the out-of-fold accuracy on 50/75/100%% of the rows and the expected accuracy and gate "
                        "coverage with N more rows (written into --out's metrics.label_curve too)")
    p.add_argument("--guard", choices=list(GUARDS),
                   help="steering guard the exported policy runs on the rows its gate would decide (a suspected row goes "
                        "to the fallback); default: the policy's own, else erase-and-check. 'none' turns it off - the "
                        "command prints what that costs, from the newest as-deployed Robustness check")
    p.add_argument("--fallback", type=option_id, default="human-review",
                   help="decision when gated (default: human-review)")
    p.add_argument("--out", type=out_file, help="write the calibrated policy JSON here")
    p.add_argument("--strict", action="store_true", help=f"exit {EXIT_UNREACHABLE} when the target is unreachable")
    p.add_argument("--new-run", action="store_true", help="do not reuse an earlier matching run")
    p.add_argument("--quiet", action="store_true")
    add_db(p)
    p.set_defaults(fn=run)
