"""python -m app run         start the workbench (Streamlit) on 127.0.0.1:8501, printing its URL
python -m app calibrate   evaluate a policy on a labeled set, print metrics and the gate, export the policy
python -m app bench       the same states sent to several targets: p50/p95 latency and ratios
python -m app robustness  steering, reworded question/options, extra options, order: does the decision hold?
python -m app check       CI gate: a policy on a labeled set x target against thresholds; exit 0/1/2, JUnit, Markdown
python -m app registry    calibrated policies in MLflow's model registry: register, promote (shadow check), rollback
python -m app import-log  the adapter's decision log (file or CloudWatch Logs) as a production run, replayed on a target
python -m app pool        unlabeled states kept for a policy: import (a file or a decision log), list, label
python -m app suggest     the next rows of a pool to label (a file, or a stored pool: its scores kept and reused)
python -m app deploy ...  deploy's CLI (plan, apply, status, invoke, destroy, transform), recorded in the
                          workbench's SQLite so the Deploy page and the Playground see it"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from adapter.env_settings import SettingsError  # noqa: E402

from app.cli.exit_codes import EXIT_STORE, EXIT_USAGE, UsageProblem  # noqa: E402  (the one exit-code convention)
from app.core.store import StoreUnavailable  # noqa: E402
from app.settings import WorkbenchSettings  # noqa: E402


def cmd_run(args: argparse.Namespace) -> int:
    argv = [sys.executable, "-m", "streamlit", "run", str(ROOT / "app" / "main.py"),
            "--server.address", args.host, "--server.port", str(args.port), "--server.headless", "true",
            "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal"]
    print(f"SemIf Workbench: open http://{args.host}:{args.port} (database: "
          f"{WorkbenchSettings.from_env().db})", flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    os.execve(sys.executable, argv, env)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["deploy"]:  # its own parser, shared with `python -m deploy`
        from app.cli import deploy  # lazy: deploy's CLI starts without the other commands' imports

        return deploy.main(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m app", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="start the workbench")
    try:
        settings, settings_error = WorkbenchSettings.from_env(), None
    except SettingsError as exc:
        settings, settings_error = WorkbenchSettings.from_env({}), exc
    run.add_argument("--host", default=settings.host)
    run.add_argument("--port", type=int, default=settings.port)
    run.set_defaults(fn=cmd_run)
    from app.cli import bench, calibrate, check, import_log, pool, registry, robustness, suggest  # lazy: `python -m app deploy` skips them

    for command in (calibrate, bench, robustness, import_log, check, registry, suggest, pool):
        command.add_parser(sub)
    sub.add_parser("deploy", help="deploy's CLI recorded in the workbench (python -m app deploy --help)")
    args = ap.parse_args(argv)
    if settings_error:  # a bad SEMIF_* value: named, exit 2 (usage), before any work
        print(f"error: {settings_error}", file=sys.stderr)
        return 2
    try:
        return int(args.fn(args))
    except StoreUnavailable as exc:  # one line naming the file and the fix, not a traceback
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_STORE
    except UsageProblem as exc:  # a bad argument or input found before any work: one line, exit 2
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
