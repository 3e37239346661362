"""`python -m app bench`: the same states sent to several targets, warm p50/p95/max and their ratios,
decisions/s and $ per 1,000; saved as a comparison the Compare page opens."""
from __future__ import annotations

import argparse
import sys

from app.cli.common import add_db, add_mapping, columns, count, error, out_file, resolve, store
from app.service import decide
from app.service.inputs import Ask


def run(args: argparse.Namespace) -> int:
    db = store(args)
    given = resolve(db, Ask(args.policy, states=args.states, limit=args.limit, columns=columns(args),  # every label keeps its share
                            calibrated=tuple(args.calibrated or ()), targets=tuple(args.target)))
    problems = decide.head_problems(given.policy, given.calibrated)
    if problems:
        error("--calibrated: " + " ".join(problems))
        return 2
    cases, targets = given.cases, given.targets
    result = decide.bench(db, given)
    print(f"{len(cases)} states x {len(targets)} targets, sequential, warm; saved as comparison "
          f"{result.runs[0]['group_id']} (Compare page)")
    print("| target | p50 ms | p95 ms | max ms | p50 vs first | p95 vs first | decisions/s | $ per 1,000 | errors |")
    print("|---|---|---|---|---|---|---|---|---|")
    for _, s in result.latency.iterrows():
        usd = "n/a" if s["usd_per_1000"] != s["usd_per_1000"] else f"${s['usd_per_1000']:.4f}"
        print(f"| {s['target']} | {s['p50_ms']:.0f} | {s['p95_ms']:.0f} | {s['max_ms']:.0f} | {s['p50_vs_first']:.2f}x | "
              f"{s['p95_vs_first']:.2f}x | {s['decisions_per_s']:.2f} | {usd} | {s['errors']} |")
    for _, a in result.accuracy.iterrows():
        print(f"accuracy {a['target']}: {a['accuracy']:.1%} of {a['labeled']} labeled states "
              f"(95% CI {a['ci_low']:.1%}-{a['ci_high']:.1%})")
    for h in result.heads.to_dict("records"):
        print(f"head column {h['column']}: {h['read']} of {h['answered']} rows read; sent to the fallback "
              f"{h['gated']} of {h['read']}; its latency is {h['target']}'s (the head costs microseconds)")
    for note in result.head_notes:
        print(f"no head column: {note}", file=sys.stderr)
    for d in result.degenerate:
        print(f"warning: {d['target']} answered {d['option']} for {d['share']:.0%} of {d['n']} states - it is not "
              "really deciding", file=sys.stderr)
    if args.html:
        from app.ui import charts

        charts.latency_ecdf(result.results).write_html(args.html, include_plotlyjs="cdn")
        print(f"wrote the ECDF to {args.html}", file=sys.stderr)
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench", help="latency benchmark of several targets on the same states")
    p.add_argument("--policy", required=True)
    p.add_argument("--states", required=True, help="CSV/JSONL with a state column (e.g. data/cases/probe.jsonl); "
                   "labels, when given, must be the policy's option ids")
    add_mapping(p, "--states")
    p.add_argument("--target", action="append", required=True, help="target name; repeat (the first is the baseline)")
    p.add_argument("--limit", type=count, default=0, help="at most N states, evenly spaced")
    p.add_argument("--calibrated", action="append", metavar="ID_OR_FILE",
                   help="a calibrated policy of this policy (saved id or file); repeat. Each adds a column per "
                        "target of its model: its decision as deployed (head or correction, gate) on that target's rows")
    p.add_argument("--html", type=out_file, help="also write the latency ECDF (plotly) to this HTML file")
    add_db(p)
    p.set_defaults(fn=run)
