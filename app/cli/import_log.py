"""`python -m app import-log`: a decision log (file or CloudWatch Logs) as a production run,
optionally replayed on a target (app/service/production.py)."""
from __future__ import annotations

from typing import Any, Mapping

import argparse
import sys
from pathlib import Path

from app.cli.common import add_db, error, resolve, store
from app.core.decision_import import parse_text
from app.service import production
from app.service.decide import InputError
from app.service.inputs import Ask


def run(args: argparse.Namespace) -> int:
    if bool(args.file) == bool(args.cloudwatch):
        error("give exactly one of FILE (a decision log file) or --cloudwatch GROUP")
        return 2
    db = store(args)
    given = resolve(db, Ask(args.policy, targets=(args.replay_on,) if args.replay_on else (), target_flag="--replay-on"))
    policy = given.policy
    try:
        if args.file:
            path = Path(args.file)
            if not path.is_file():
                error(f"{args.file}: no such file")
                return 2
            parsed, source = parse_text(path.read_bytes()), path.name
        else:
            parsed = production.read_cloudwatch(args.cloudwatch, stream_prefix=args.stream_prefix, start=args.start,
                                                end=args.end, endpoint_url=args.endpoint_url)
            source = f"cloudwatch:{args.cloudwatch}"
        imported = production.import_log(db, parsed, policy, source=source)
    except InputError as exc:
        error("; ".join(exc.problems[:5]))
        return 2
    except ValueError as exc:
        error(exc)
        return 2
    for problem in imported.warnings[:20]:
        print(f"warning: {problem}", file=sys.stderr)
    s = imported.summary
    left = ", ".join(f"{n} × {why}" for why, n in s["left_out"].items())
    print(f"production run #{imported.run_id}: {s['decisions']} decisions from {source} ({s['with_state']} with a "
          f"state, {s['gated']} gated)" + (f"; left out {left}" if left else ""))
    if given.targets:
        t = given.target  # resolved with the policy: an unknown --replay-on is refused before anything is imported
        try:
            replay_id = production.replay(db, imported.run_id, t)
        except ValueError as exc:
            error(exc)
            return 2
        done: Mapping[str, Any] = db.get_run(replay_id) or {}
        print(f"replay run #{replay_id} on {t.name}: {done.get('status')} ({len(db.results(replay_id))} rows)")
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("import-log", help="import the adapter's decision log (file or CloudWatch) as a production run")
    p.add_argument("file", nargs="?", help="a decision log file (SM_SEMIF_DECISION_LOG=path, or saved stdout)")
    p.add_argument("--cloudwatch", metavar="GROUP", help="a CloudWatch Logs group, e.g. /aws/sagemaker/Endpoints/NAME")
    p.add_argument("--stream-prefix", help="only log streams starting with this (e.g. the variant name)")
    p.add_argument("--start", help="ISO date/time of the first event (CloudWatch)")
    p.add_argument("--end", help="ISO date/time of the last event (CloudWatch)")
    p.add_argument("--endpoint-url", help="another AWS endpoint (default SEMIF_AWS_ENDPOINT_URL; tests: moto)")
    p.add_argument("--policy", required=True, help="the policy the decisions were made with (id, template or JSON file)")
    p.add_argument("--replay-on", metavar="TARGET", help="then score the rows with a logged state on this target")
    add_db(p)
    p.set_defaults(fn=run)
