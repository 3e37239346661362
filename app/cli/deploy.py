"""`python -m app deploy ...`: deploy's own CLI (plan, apply, status, invoke, destroy, transform) with the
workbench's SQLite as its ledger (app/core/deploy_records.StoreRecorder) instead of deploy's audit file,
so the Deploy page and the Playground see what the command did."""
from __future__ import annotations

import argparse
import sys

from deploy import cli

from app.core.deploy_records import StoreRecorder
from app.core.store import Store
from app.service import deploy as deploy_service
from app.service import registry
from app.settings import WorkbenchSettings


def open_store(db: str | None = None) -> Store:
    """The workbench store the CLI records into (SEMIF_DB or data/workbench.db when db is None)."""
    return Store(db)


def resolved_policies(argv: list[str]) -> list[str]:
    """`--policy models:/NAME@ALIAS` (or /VERSION) replaced by the version's policy file, validated
    (app/service/registry.resolve): deploy packages a plain file, never a live reference. Exit 2 naming the
    problem when the reference cannot be resolved."""
    out, db = list(argv), next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--db"), None)
    for i, arg in enumerate(out):
        flag, eq, value = arg.partition("=")
        ref = value if flag == "--policy" and eq else out[i + 1] if arg == "--policy" and i + 1 < len(out) else None
        if ref is None or not registry.is_reference(ref):
            continue
        try:
            got = registry.resolve(ref, into=registry.policies_dir(Store(db)) if db else None)
        except registry.RegistryError as exc:
            print(f"error: --policy {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        print(f"--policy {ref}: {got.name} v{got.version} -> {got.path}", file=sys.stderr)
        if eq:
            out[i] = f"--policy={got.path}"
        else:
            out[i + 1] = str(got.path)
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m app deploy ...`: deploy's CLI, recording into the workbench store (--db)."""
    argv = resolved_policies(sys.argv[1:] if argv is None else argv)
    def add_db(p: argparse.ArgumentParser) -> None:
        p.add_argument("--db", help="workbench SQLite (default: SEMIF_DB or data/workbench.db)")

    runtime_url = WorkbenchSettings.from_env().aws_runtime_url

    def ledger(args: argparse.Namespace) -> StoreRecorder:
        # a live endpoint becomes a target (reached through SEMIF_AWS_RUNTIME_URL when set, e.g. a test shim)
        return deploy_service.ledger(open_store(args.db), runtime_url or args.endpoint_url)

    doc = (cli.__doc__ or "").split("Every apply/destroy")[0].replace("python -m deploy", "python -m app deploy")
    return cli.main(argv, prog="python -m app deploy", add_ledger_args=add_db, open_ledger=ledger,
                    description=doc + "Every apply/destroy is recorded in the workbench's SQLite (deployments + "
                    "audit log), and a live endpoint becomes a target in the Playground.\n")
