"""Headless calibration: `python -m app calibrate ...` for scripts and CI."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from adapter.templates import DATA_DIR, request_for

from . import evaluation
from .engines import EnginePool
from .inputs import InputError
from .labeled import import_file
from .policy_form import templates, validate_policy
from .target_registry import target_by_name
from .store import RunBusy, StaleEdit, Store

EXIT_UNREACHABLE = 3
WARM_UP_STATE = "Warm-up call before the benchmark (not measured)."
EXIT_BUSY = 4


def resolve_policy(store: Store, ref: str) -> dict:
    """A policy id in the store, a shipped template id, or a JSON file."""
    found = store.get_policy(ref) or templates().get(ref)
    if found is None and Path(ref).is_file():
        found = json.loads(Path(ref).read_text())
    if found is None:
        raise SystemExit(f"--policy {ref!r}: not a saved policy, a template ({', '.join(templates())}) or a JSON file")
    clean, errs = validate_policy(found)
    if errs or clean is None:
        raise SystemExit(f"--policy {ref!r} is invalid: " + "; ".join(f"{k}: {v}" for k, v in errs.items()))
    if store.get_policy(clean["id"]) is None:
        try:
            store.save_policy(clean, expected_version=0)
        except StaleEdit:  # saved by someone else meanwhile: runs keep their own copy of the policy
            pass
    return clean


def resolve_set(store: Store, ref: str, policy: dict) -> int:
    path = Path(ref)
    if not path.is_file() and (DATA_DIR / "labeled" / ref).is_file():
        path = DATA_DIR / "labeled" / ref
    if path.is_file():
        try:
            return import_file(store, path.name, path.read_bytes(), policy, source=str(path))
        except InputError as exc:
            raise SystemExit(f"--labeled-set {ref}: rejected, nothing imported:\n  " + "\n  ".join(exc.problems[:20]))
    if ref.isdigit() and store.get_labeled_set(int(ref)):
        return int(ref)
    raise SystemExit(f"--labeled-set {ref!r}: no such file or stored set id")


def fmt(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def calibrate(args) -> int:
    from tqdm import tqdm

    store = Store(args.db)
    policy = resolve_policy(store, args.policy)
    set_id = resolve_set(store, args.labeled_set, policy)
    target = target_by_name(store, args.target, EnginePool())  # one model load for the whole run
    variant = evaluation.Variant(args.readout, args.debias, args.permute)
    try:
        run_id, resumed = evaluation.find_or_start(store, policy=policy, set_id=set_id, target=target, variant=variant,
                                                   examples=args.examples, n_examples=args.n_examples,
                                                   new_run=args.new_run)
    except ValueError as exc:  # e.g. the set's labels are not this policy's options
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"run #{run_id} ({'resumed' if resumed else 'new'}): policy {policy['id']} x set #{set_id} x target "
          f"{target.name} ({variant.name})", file=sys.stderr)
    with tqdm(total=(store.get_run(run_id) or {}).get("n_rows", 0), unit="row", file=sys.stderr,
              disable=args.quiet) as bar:
        def progress(done, total, eta):
            bar.n = done
            bar.refresh()

        try:
            outcome = evaluation.resume_eval(store, run_id, target, progress)
        except RunBusy as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_BUSY
    print(f"scored {outcome['scored']} rows, reused {outcome['skipped']}, errors {outcome['errors']}", file=sys.stderr)
    cal = evaluation.calibrate_run(store, run_id, target_accuracy=args.target_accuracy, per_option=args.per_option)
    rep = cal["report"]
    print(f"rows {rep.n} ({rep.size_flag}) accuracy {rep.accuracy:.3f} macro-F1 {rep.macro_f1:.3f} "
          f"Brier {rep.brier:.3f} NLL {rep.nll:.3f}")
    print(f"correction {cal['correction_why']}")
    print(f"ECE (10 equal-width bins) {rep.ece_width:.3f} -> {rep.oof_ece_width:.3f} after {cal['correction'].name} "
          f"T={rep.temperature:.3f} (out of fold); equal-mass {rep.ece_mass:.3f} -> {rep.oof_ece_mass:.3f}")
    gate = evaluation.decide_gate(cal, args.gate)
    for line in gate.messages:
        print(line)
    if gate.source == "hand-set":
        print(f"gate set by hand: {gate.threshold:.3f}")
    option_thresholds = {oid: g.threshold for oid, g in cal["option_gates"].items() if g.reachable}
    config = evaluation.build_policy(store, run_id, cal, gate=gate, fallback=args.fallback,
                                     option_thresholds=option_thresholds)
    at = config["metrics"]["at_gate"]
    print(f"exported rule on all {at['n']} rows: decides {at['decided']} (coverage {fmt(at['coverage'])}), "
          f"accuracy {fmt(at['accuracy'])}, {at['gated']} to fallback {args.fallback!r}")
    if args.out:
        Path(args.out).write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    return EXIT_UNREACHABLE if (args.strict and gate.source == "unreachable") else 0


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="evaluate a policy on a labeled set and export a calibrated policy")
    p.add_argument("--policy", required=True, help="saved policy id, template id, or JSON file")
    p.add_argument("--labeled-set", required=True, help="CSV/JSONL file (or a file name in data/labeled), or a set id")
    p.add_argument("--target", default="local", help="target name (default: the local engine)")
    p.add_argument("--readout", choices=["letters", "option-words"], help="default: the policy's / model's")
    p.add_argument("--debias", choices=["none", "content-free"], help="default: the policy's / model's")
    p.add_argument("--permute", action="store_true", help="permutation averaging")
    p.add_argument("--examples", choices=evaluation.EXAMPLE_SOURCES, default="policy",
                   help="few-shot examples from the policy, or from the set's train split")
    p.add_argument("--n-examples", type=int, default=4)
    p.add_argument("--target-accuracy", type=float, default=0.9)
    p.add_argument("--gate", type=float, help="set the confidence gate by hand instead of from the target")
    p.add_argument("--per-option", action="store_true", help="also fit one gate per option")
    p.add_argument("--fallback", default="human-review", help="decision when gated (default: human-review)")
    p.add_argument("--out", help="write the calibrated policy JSON here")
    p.add_argument("--strict", action="store_true", help=f"exit {EXIT_UNREACHABLE} when the target is unreachable")
    p.add_argument("--new-run", action="store_true", help="do not reuse an earlier matching run")
    p.add_argument("--db", help="SQLite file (default: SEMIF_DB or data/workbench.db)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(fn=calibrate)


def bench(args) -> int:
    """The same states sent sequentially to each target (after one warm-up call each, so model
    loads and connections are not measured): p50 / p95 / max per target, their ratios to the first,
    decisions per second and cost per 1,000 decisions; saved as a comparison the Compare page opens
    (ECDF, box plot), optionally the ECDF as a standalone HTML file."""
    from . import analysis, charts
    from .inputs import rows_from_upload
    from .runner import is_cold, run_policy

    store = Store(args.db)
    policy = resolve_policy(store, args.policy)
    path = Path(args.states)
    rows = rows_from_upload(path.name, path.read_bytes())
    options = {o["id"] for o in policy["options"]}
    foreign = [r for r in rows if r.label is not None and r.label not in options]
    if foreign:  # latency is the point here: keep the states, count accuracy only where it can be right
        print(f"{len(foreign)} of {len(rows)} labels are not options of {policy['id']}: those rows count for "
              "latency, not accuracy", file=sys.stderr)
        for r in foreign:
            r.label = None
    if args.limit:
        step = max(1, len(rows) // args.limit)  # evenly spaced: every label keeps its share
        rows = rows[::step][: args.limit]
    provider = EnginePool()
    targets = [target_by_name(store, name, provider) for name in args.target]
    for t in targets:  # warm up (model load, connections, the policy's first pass) outside the measurement, on a
        warm = request_for(policy, WARM_UP_STATE, "warm-up")  # state of its own: row 0 is not answered from its logits
        is_cold(t, warm)  # counted as this target's first call, so every measured call is warm
        t.decide(warm)
    group, run_ids = run_policy(store, policy, rows, targets, kind="compare")
    df, stats = analysis.comparison_stats(store, group)  # what the Compare page shows for this comparison
    print(f"{len(rows)} states x {len(targets)} targets, sequential, warm; saved as comparison {group} (Compare page)")
    print("| target | p50 ms | p95 ms | max ms | p50 vs first | p95 vs first | decisions/s | $ per 1,000 | errors |")
    print("|---|---|---|---|---|---|---|---|---|")
    for _, s in stats.iterrows():
        usd = "n/a" if s["usd_per_1000"] != s["usd_per_1000"] else f"${s['usd_per_1000']:.4f}"
        print(f"| {s['target']} | {s['p50_ms']:.0f} | {s['p95_ms']:.0f} | {s['max_ms']:.0f} | {s['p50_vs_first']:.2f}x | "
              f"{s['p95_vs_first']:.2f}x | {s['decisions_per_s']:.2f} | {usd} | {s['errors']} |")
    acc = analysis.accuracy_by_target(df)
    for _, a in acc.iterrows():
        print(f"accuracy {a['target']}: {a['accuracy']:.1%} of {a['labeled']} labeled states")
    if args.html:
        charts.latency_ecdf(df).write_html(args.html, include_plotlyjs="cdn")
        print(f"wrote the ECDF to {args.html}", file=sys.stderr)
    return 0


def add_bench_parser(sub) -> None:
    p = sub.add_parser("bench", help="latency benchmark of several targets on the same states")
    p.add_argument("--policy", required=True)
    p.add_argument("--states", required=True, help="CSV/JSONL with a state column (e.g. data/cases/probe.jsonl)")
    p.add_argument("--target", action="append", required=True, help="target name; repeat (the first is the baseline)")
    p.add_argument("--limit", type=int, default=0, help="at most N states, evenly spaced")
    p.add_argument("--html", help="also write the latency ECDF (plotly) to this HTML file")
    p.add_argument("--db")
    p.set_defaults(fn=bench)


def robustness(args) -> int:
    """The Robustness check headless: the same rows, rates and verdicts as the page, as JSON."""
    from tqdm import tqdm

    from . import robustness as rb
    from .inputs import rows_from_upload
    from .labeled import evenly_spaced, scored_cases

    store = Store(args.db)
    policy = resolve_policy(store, args.policy)
    ids = [o["id"] for o in policy["options"]]
    if bool(args.labeled_set) == bool(args.states):
        raise SystemExit("give exactly one of --labeled-set (a labeled set) or --states (a CSV/JSONL of states)")
    try:
        if args.labeled_set:
            cases = scored_cases(store, resolve_set(store, args.labeled_set, policy), args.limit)
            source = f"labeled set {args.labeled_set}"
        else:
            path = Path(args.states)
            cases = evenly_spaced(rows_from_upload(path.name, path.read_bytes(), ids), args.limit)
            source = str(path)
        suite = rb.shipped_suite(policy)
        if args.templates:
            suite.steering += rb.parse_templates(Path(args.templates).read_text())
        suite.paraphrases += args.paraphrase or []
        out_of_scope = [c.state for c in rows_from_upload(Path(args.out_of_scope).name,
                                                          Path(args.out_of_scope).read_bytes())] if args.out_of_scope else []
        checks = [c.strip() for c in args.checks.split(",")] if args.checks else list(rb.CHECKS)
        target = target_by_name(store, args.target, EnginePool())
        variant = evaluation.VARIANTS.get(args.readout)
        if variant is None:
            raise SystemExit(f"--readout {args.readout!r}: choose from {', '.join(evaluation.VARIANTS)}")
        run_id, items = rb.start_check(store, policy=policy, cases=cases, target=target, suite=suite, checks=checks,
                                       attempts=args.attempts, variant=args.readout, overrides=variant.overrides(),
                                       guard=args.guard, out_of_scope=out_of_scope, source=source)
    except (InputError, rb.SuiteError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"robustness run #{run_id}: {policy['id']} x {len(cases)} states x target {target.name} ({args.readout}, "
          f"guard {args.guard}) - {len(items)} rows to score", file=sys.stderr)
    with tqdm(total=len(items), unit="row", file=sys.stderr, disable=args.quiet) as bar:
        def progress(done, total, eta):
            bar.n = done
            bar.refresh()

        report = rb.run_check(store, run_id, items, target, progress)
    summary = {"run": run_id, **report.summary}
    for check, (level, text) in report.verdicts.items():
        print(f"[{level.upper():4}] {rb.CHECK_LABELS[check]}: {text}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def add_robustness_parser(sub) -> None:
    from .robustness import CHECKS

    p = sub.add_parser("robustness", help="steering, paraphrase, renamed/extra options, order: does the decision hold?")
    p.add_argument("--policy", required=True, help="saved policy id, template id, or JSON file")
    p.add_argument("--labeled-set", help="CSV/JSONL file (or a file name in data/labeled), or a set id")
    p.add_argument("--states", help="CSV/JSONL with a state column (labels optional)")
    p.add_argument("--target", default="local", help="target name (default: the local engine)")
    p.add_argument("--limit", type=int, default=20, help="at most N states, evenly spaced (default 20)")
    p.add_argument("--attempts", type=int, default=3, help="steering attempts per state (default 3)")
    p.add_argument("--checks", help=f"comma-separated subset of {','.join(CHECKS)} (default: all)")
    p.add_argument("--readout", default="default", help="readout variant, as on the Calibrate page (default: default)")
    p.add_argument("--guard", default="none", choices=["none", "precheck", "erase-and-check"],
                   help="the steering guard on the unchanged and the steered rows")
    p.add_argument("--templates", help="a text file of your own steering templates, one per line, each with {option}")
    p.add_argument("--paraphrase", action="append", help="a rewording of the question; repeat")
    p.add_argument("--out-of-scope", help="CSV/JSONL of states that fit no option (for the none-of-these check)")
    p.add_argument("--json", help="write the summary (hijack_rate, still_correct_rate, flip_rate, n, ...) here")
    p.add_argument("--db", help="SQLite file (default: SEMIF_DB or data/workbench.db)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(fn=robustness)
