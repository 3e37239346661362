"""Headless calibration: `python -m app calibrate ...` for scripts and CI."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from adapter.templates import DATA_DIR, request_for

from app.core import evaluation
from app.core.engines import EnginePool
from app.core.inputs import InputError
from app.core.labeled import import_file
from app.core.policies import templates, validate_policy
from app.targets.registry import target_by_name
from app.core.store import RunBusy, StaleEdit, Store

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
    print(f"scored {outcome['scored']} rows ({outcome['evaluated']} evaluated, {outcome['reused']} copied from stored "
          f"results of the same model and request), reused {outcome['skipped']} already in this run, errors "
          f"{outcome['errors']}", file=sys.stderr)
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
    from app.core import analysis
    from app.ui import charts
    from app.core.inputs import rows_from_upload
    from app.core.runner import is_cold, run_policy

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

    from app.core import robustness as rb
    from app.core.inputs import rows_from_upload
    from app.core.labeled import evenly_spaced, scored_cases

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
    from app.core.robustness import CHECKS

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


def import_log(args) -> int:
    """A decision log (file or CloudWatch Logs) as a production run; optionally replayed on a target."""
    from datetime import datetime

    from app.core import decision_import as di
    from app.core.settings import WorkbenchSettings

    if bool(args.file) == bool(args.cloudwatch):
        print("error: give exactly one of FILE (a decision log file) or --cloudwatch GROUP", file=sys.stderr)
        return 2
    store = Store(args.db)
    try:
        policy = resolve_policy(store, args.policy)
        if args.file:
            path = Path(args.file)
            if not path.is_file():
                print(f"error: {args.file}: no such file", file=sys.stderr)
                return 2
            parsed, source = di.parse_text(path.read_bytes()), path.name
        else:
            def ms(text: str | None, flag: str) -> int | None:
                if not text:
                    return None
                try:
                    return int(datetime.fromisoformat(text).timestamp() * 1000)
                except ValueError:
                    raise SystemExit(f"{flag} {text!r}: give an ISO date/time, e.g. 2026-12-01T09:00:00+00:00")

            settings = WorkbenchSettings.from_env()
            lines = di.fetch_cloudwatch(args.cloudwatch, stream_prefix=args.stream_prefix,
                                        start_ms=ms(args.start, "--start"), end_ms=ms(args.end, "--end"),
                                        region=settings.region, endpoint_url=args.endpoint_url or settings.aws_endpoint_url)
            parsed, source = di.parse_lines(lines), f"cloudwatch:{args.cloudwatch}"
        for problem in parsed.problems[:20]:
            print(f"warning: {problem}", file=sys.stderr)
        if not parsed.records:
            print(f"error: no decision lines in {source} ({parsed.skipped} other lines): was the adapter started "
                  "with SM_SEMIF_DECISION_LOG?", file=sys.stderr)
            return 2
        run_id, summary = di.import_records(store, parsed.records, policy, source=source)
    except InputError as exc:
        print("error: " + "; ".join(exc.problems[:5]), file=sys.stderr)
        return 2
    except SystemExit as exc:  # a bad --policy: usage, not a failed check
        print(f"error: {exc}", file=sys.stderr)
        return 2
    left = ", ".join(f"{n} × {why}" for why, n in summary["left_out"].items())
    print(f"production run #{run_id}: {summary['decisions']} decisions from {source} ({summary['with_state']} with a "
          f"state, {summary['gated']} gated)" + (f"; left out {left}" if left else ""))
    if args.replay_on:
        target = target_by_name(store, args.replay_on, EnginePool())
        try:
            replay_id = di.replay(store, run_id, target)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        done = store.get_run(replay_id) or {}
        print(f"replay run #{replay_id} on {target.name}: {done.get('status')} ({len(store.results(replay_id))} rows)")
    return 0


def add_import_parser(sub) -> None:
    p = sub.add_parser("import-log", help="import the adapter's decision log (file or CloudWatch) as a production run")
    p.add_argument("file", nargs="?", help="a decision log file (SM_SEMIF_DECISION_LOG=path, or saved stdout)")
    p.add_argument("--cloudwatch", metavar="GROUP", help="a CloudWatch Logs group, e.g. /aws/sagemaker/Endpoints/NAME")
    p.add_argument("--stream-prefix", help="only log streams starting with this (e.g. the variant name)")
    p.add_argument("--start", help="ISO date/time of the first event (CloudWatch)")
    p.add_argument("--end", help="ISO date/time of the last event (CloudWatch)")
    p.add_argument("--endpoint-url", help="another AWS endpoint (default SEMIF_AWS_ENDPOINT_URL; tests: moto)")
    p.add_argument("--policy", required=True, help="the policy the decisions were made with (id, template or JSON file)")
    p.add_argument("--replay-on", metavar="TARGET", help="then score the rows with a logged state on this target")
    p.add_argument("--db", help="SQLite file (default: SEMIF_DB or data/workbench.db)")
    p.set_defaults(fn=import_log)


def check_policy(store: Store, ref: str) -> tuple[dict, "Any"]:
    """(the policy as the workbench evaluates it, the calibrated policy or None): a calibrated
    policy file (semif-policy/1, as Calibrate exports and the adapter enforces) brings its question,
    options, examples, readout, correction and gate; anything else is a workbench policy."""
    from adapter.calibrated import PolicyError, load_policy

    path = Path(ref)
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise SystemExit(f"--policy {ref}: not readable JSON ({exc})")
        if isinstance(data, dict) and "schema_version" in data:
            try:
                cal = load_policy(data)
            except PolicyError as exc:
                raise SystemExit(f"--policy {ref}: {exc}")
            policy = {"id": cal.policy_id, "name": cal.name or cal.policy_id, "question": cal.question,
                      "options": [o.model_dump() for o in cal.options], "examples": [e.model_dump() for e in cal.examples],
                      "readout": cal.readout, "debias": cal.debias}
            return policy, cal
    return resolve_policy(store, ref), None


def check(args) -> int:
    """Evaluate (reusing stored results of the same model and request), judge every threshold given,
    write JUnit / Markdown; exit 0 / 1 / 2 (app/check.py)."""
    from adapter.decision_log import policy_version

    from app.core import check as ck
    from app.core import drift as dr
    from app.core.gates import Gate, measure

    bounds = {k: getattr(args, k) for k in ("min_accuracy", "min_gate_accuracy", "min_coverage", "max_ece",
                                            "max_flips", "max_broken")}
    if all(v is None for v in bounds.values()):
        print("error: give at least one threshold (--min-accuracy, --min-gate-accuracy, --min-coverage, --max-ece, "
              "--max-flips, --max-broken)", file=sys.stderr)
        return ck.EXIT_USAGE
    if (bounds["max_flips"] is not None or bounds["max_broken"] is not None) and not args.baseline:
        print("error: --max-flips / --max-broken compare against a run: give --baseline RUN (a run id, or 'pinned')",
              file=sys.stderr)
        return ck.EXIT_USAGE
    store = Store(args.db)
    try:
        policy, calibrated = check_policy(store, args.policy)
        if (bounds["min_gate_accuracy"] is not None or bounds["min_coverage"] is not None) and calibrated is None \
                and args.gate is None:
            raise SystemExit("--min-gate-accuracy / --min-coverage need a gate: give a calibrated policy file "
                             "(semif-policy/1, from Calibrate) as --policy, or --gate CONFIDENCE")
        set_id = resolve_set(store, args.labeled_set, policy)
        baseline = None
        if args.baseline:
            baseline = store.pinned_run() if args.baseline == "pinned" else (
                store.get_run(int(args.baseline)) if args.baseline.isdigit() else None)
            if baseline is None:
                raise SystemExit(f"--baseline {args.baseline!r}: no such run (a run id from History, or 'pinned')")
        target = target_by_name(store, args.target, EnginePool())
        if calibrated is not None:
            variant = evaluation.Variant(calibrated.readout, calibrated.debias, calibrated.permute, calibrated.few_shot)
        else:
            variant = evaluation.Variant(args.readout, args.debias, args.permute)
        run_id = evaluation.start_eval(store, policy=policy, set_id=set_id, target=target, variant=variant, kind="check")
    except (SystemExit, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ck.EXIT_USAGE
    try:
        outcome = evaluation.resume_eval(store, run_id, target, reuse=not args.no_reuse)
    except RunBusy as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ck.EXIT_USAGE
    results = store.results(run_id)
    print(f"check run #{run_id}: {len(results)} rows, {outcome['evaluated']} evaluated, {outcome['reused']} reused "
          "from stored results of the same model and request", file=sys.stderr)
    failed = [r for r in results if r["error"]]
    if failed:
        print(f"error: target {target.name} failed on {len(failed)} of {len(results)} rows, e.g. "
              f"{failed[0]['row_key']}: {failed[0]['error']} - nothing was judged", file=sys.stderr)
        return ck.EXIT_USAGE
    gate = Gate(policy=calibrated, check_model=True) if calibrated is not None else Gate(threshold=args.gate)
    metrics = measure(results, gate)
    drift = None
    if baseline is not None:
        drift = dr.compare(store.results(baseline["id"]), results, gate=gate)
        if not drift.pairs:
            print(f"error: --baseline #{baseline['id']} has no rows in common with this check (rows are matched by "
                  "id and state): pick a run of the same labeled set", file=sys.stderr)
            return ck.EXIT_USAGE
    labeled = store.get_labeled_set(set_id) or {}
    first: dict = next((r["response"] for r in results if isinstance(r.get("response"), dict)), {})
    model = first.get("model") or {}
    context = {"policy": policy["id"], "labeled_set": f"{labeled.get('name')} (#{set_id})",
               "dataset_hash": labeled.get("content_hash", ""), "target": target.name,
               "model": f"{model.get('file')} ({str(model.get('sha256', ''))[:12]})", "run": run_id,
               "rows": len(results), "evaluated": outcome["evaluated"], "reused": outcome["reused"], "gate": gate.name}
    if calibrated is not None:
        context["policy_version"] = policy_version(calibrated)
        if model.get("sha256") and model["sha256"] != calibrated.model.sha256:
            context["model_mismatch"] = (f"the policy was calibrated on {calibrated.model.file}; {target.name} runs "
                                         f"{model.get('file')}: the adapter sends every row to the fallback")
        if calibrated.guard != "none":
            context["guard"] = f"the policy's steering guard ({calibrated.guard}) is not run by check"
    if baseline is not None and drift is not None:
        context["baseline"] = f"run #{baseline['id']} ({baseline['target_name']}, {len(drift.pairs)} rows in common)"
    report = ck.CheckReport(ck.evaluate(metrics, bounds, drift), context,
                            [p.to_dict() for p in drift.pairs if p.kind in dr.FLIP_KINDS] if drift else [])
    for o in report.outcomes:
        print(f"[{'PASS' if o.passed else 'FAIL'}] --{o.name}: {o.message}")
    suite = f"semif check {policy['id']} on {labeled.get('name')} x {target.name}"
    try:
        if args.junit:
            Path(args.junit).write_text(ck.junit_xml(report, suite))
        if args.summary:
            Path(args.summary).write_text(ck.markdown(report))
    except OSError as exc:
        print(f"error: cannot write the report: {exc}", file=sys.stderr)
        return ck.EXIT_USAGE
    return report.exit_code


def add_check_parser(sub) -> None:
    def rate(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number: give a rate between 0 and 1, e.g. 0.8")
        if not 0 <= value <= 1:
            raise argparse.ArgumentTypeError(f"{text} is not between 0 and 1: give a rate, e.g. 0.8 for 80%")
        return value

    def count(text: str) -> int:
        if not text.isdigit():
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0")
        return int(text)

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
    p.add_argument("--readout", choices=["letters", "option-words"], help="plain policy: default the policy's / model's")
    p.add_argument("--debias", choices=["none", "content-free"], help="plain policy: default the policy's / model's")
    p.add_argument("--permute", action="store_true", help="plain policy: permutation averaging")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML: one test case per threshold")
    p.add_argument("--summary", metavar="FILE", help="write Markdown for a pull-request comment")
    p.add_argument("--no-reuse", action="store_true", help="score every row even when a stored result would do")
    p.add_argument("--db", help="SQLite file (default: SEMIF_DB or data/workbench.db)")
    p.set_defaults(fn=check)
