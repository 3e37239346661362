"""python -m deploy {plan,apply,status,invoke,destroy,transform}

plan       package locally, print the validated plan as JSON; calls no AWS API
apply      package, then run exactly the printed plan: upload, (build the SemIf image,) create the
           endpoint, wait, (autoscaling); --dry-run = plan; --local = the same plan in the local SemIf
           image on podman (SageMaker's "local mode": no AWS, no bucket or role needed)
status     endpoint status, failure reason, which GPU pool won
invoke     send one request body to the endpoint (sagemaker-runtime)
destroy    delete scaling policy/target, endpoint, endpoint config and model (reverse order);
           --local = stop and remove the local container
transform  Batch Transform of decision rows (JSON Lines) on a SageMaker model; results JSONL on stdout

Every apply/destroy is written to a ledger: here a JSON-lines audit file (--audit-log). The same
commands as `python -m app deploy ...` write to the workbench's SQLite instead (deployments, audit
log, and a live endpoint becomes a Playground target). deploy/ itself never imports the workbench.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, NoReturn

from .audit_file import AuditFile, Ledger
from adapter.env_settings import SettingsError, finite

from .config import (COMPUTES, DEFAULT_CPU_INSTANCE, DEFAULT_TRANSFORM_INSTANCE, FORM_PLACEHOLDERS, PLACEHOLDER_HINTS,
                     SERVINGS, DeployConfig, FormErrors, config_from_form)
from .executor import DeployError, Event, Executor
from .local import LocalRunner
from .plan import Package, Step, placeholders
from .package import build_package
from .prepare import prepare
from .pricing import hint
from .settings import DeploySettings
from .transform import TransformSite, prepare_transform, site_from_form, transform_plan
from .validate import validate_plan

FORM_FLAGS = ["region", "bucket", "role_arn", "serving", "compute", "codebuild_role_arn", "account_id", "instance_type",
              "instance_count", "image_uri", "ctx_size", "startup_timeout", "download_timeout", "provision_timeout",
              "suffix", "autoscale_min", "autoscale_max", "decisions_per_second", "utilisation", "scale_in_cooldown",
              "scale_out_cooldown"]


FLAG_OF = {"pools": "pool", "model_path": "model", "policy_path": "policy"}  # form field -> flag, where they differ


def flag(key: str) -> str:
    return "--" + FLAG_OF.get(key, key).replace("_", "-")


def form_from(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str]]:
    """The deployment form from the flags, and which variable each value not given as a flag came
    from: the bucket and the role ARNs fall back to theirs (deploy/settings.py), never to a made-up one."""
    settings: DeploySettings = args.settings
    form: dict[str, Any] = {k: getattr(args, k, None) for k in FORM_FLAGS}
    from_env: dict[str, str] = {}
    for key, env, value in (("bucket", "SEMIF_DEPLOY_BUCKET", settings.deploy_bucket),
                            ("role_arn", "SEMIF_SAGEMAKER_ROLE_ARN", settings.sagemaker_role_arn),
                            ("codebuild_role_arn", "SEMIF_CODEBUILD_ROLE_ARN", settings.codebuild_role_arn)):
        if not form.get(key):
            form[key], from_env[key] = value, env
    form.update(model_path=getattr(args, "model", None), policy_path=getattr(args, "policy", None),
                pools=getattr(args, "pool", None))
    return form, from_env


def refuse(exc: FormErrors, form: dict[str, Any], from_env: dict[str, str]) -> NoReturn:
    """Exit 2 naming each bad flag, and the variable a missing or bad value is (or can be) set by."""
    lines = []
    for key, problem in exc.errors.items():
        var = from_env.get(key)
        if var and form.get(key):
            problem += f" (from {var}: fix it, or give {flag(key)})"
        elif var:
            problem += f": give {flag(key)} or set {var}"
        lines.append(f"{flag(key)}: {problem}")
    print("invalid options:\n  " + "\n  ".join(lines), file=sys.stderr)
    raise SystemExit(2)


def config_from(args: argparse.Namespace, *, unfilled: bool = False) -> DeployConfig:
    """The same checks as the Deploy page (deploy.config.config_from_form); exit 2 naming each flag.
    Without the bucket or a role a plan that is only printed (`unfilled`) shows a placeholder, and
    anything that would call AWS stops here, naming the flag and the variable."""
    form, from_env = form_from(args)
    try:
        return config_from_form(form, placeholders=unfilled)
    except FormErrors as exc:
        refuse(exc, form, from_env)


def site_from(args: argparse.Namespace, *, unfilled: bool = False) -> TransformSite:
    """Region and bucket for a transform that reuses a model (no role needed); exit 2 naming each flag."""
    form, from_env = form_from(args)
    try:
        return site_from_form(form, placeholders=unfilled)
    except FormErrors as exc:
        refuse(exc, form, from_env)


def unfilled_notes(steps: list[Step]) -> list[str]:
    """What a printed plan still needs before it can be applied (its bucket/role placeholders)."""
    return [f"{p}: {PLACEHOLDER_HINTS[p]}" for p in sorted(placeholders([s.params for s in steps]) & FORM_PLACEHOLDERS)]


def work_dir(args: argparse.Namespace) -> Path:
    """--work-dir (default: a temp folder); exit 2 with one line when it names something that is not a folder."""
    path = Path(args.work_dir or Path(tempfile.gettempdir()) / "semif-deploy")
    if path.exists() and not path.is_dir():
        print(f"--work-dir {path}: is a file, not a folder - name a folder (it is created when missing)", file=sys.stderr)
        raise SystemExit(2)
    if not path.exists() and path.parent.exists() and not path.parent.is_dir():
        print(f"--work-dir {path}: {path.parent} is a file, not a folder - name a folder", file=sys.stderr)
        raise SystemExit(2)
    return path


def checked_plan(cfg: DeployConfig, args: argparse.Namespace, *, unfilled: bool = False) -> tuple[Package, list[Step]]:
    """Package first (local), then the plan with the real checksums; exit 2 when invalid. `unfilled`:
    the plan is only printed, and may keep the bucket and role placeholders."""
    try:
        prepared = prepare(cfg, work_dir(args), unfilled=unfilled)
    except (ValueError, FileNotFoundError) as exc:
        print(f"cannot plan: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if prepared.errors:
        print("the plan is invalid:\n  " + "\n  ".join(prepared.errors), file=sys.stderr)
        raise SystemExit(2)
    return prepared.pkg, prepared.steps


def printable(cfg: DeployConfig, steps: list[Step]) -> dict[str, Any]:
    """The plan as printed; `unfilled` lists what it still needs before apply, when anything."""
    out = {"deployment_id": cfg.deployment_id, "endpoint": cfg.endpoint_name, "region": cfg.region,
           "serving": cfg.serving, "compute": cfg.compute, "account_id": cfg.account_id, "cost_hint": hint(cfg),
           "calls": [{"n": i, "call": f"{s.service}.{s.operation}", "why": s.description, "params": s.params}
                     for i, s in enumerate(steps, 1)]}
    notes = unfilled_notes(steps)
    if notes:
        out["unfilled"] = notes
        print("note: apply needs what this plan shows as placeholders:\n  " + "\n  ".join(notes), file=sys.stderr)
    return out


def executor(args: argparse.Namespace, on_event: Event | None = None) -> Executor:
    def show(e: dict[str, Any]) -> None:
        if e.get("phase") != "upload" or e["sent"] == e["total"]:
            print(f"[{e.get('index', '-')}/{e.get('total', '-')}] {e.get('message', '')}", file=sys.stderr, flush=True)

    return Executor(args.region, endpoint_url=args.endpoint_url, poll_seconds=args.poll, on_event=on_event or show,
                    work_dir=work_dir(args))


def cmd_plan(args: argparse.Namespace) -> int:
    cfg = config_from(args, unfilled=True)
    print(json.dumps(printable(cfg, checked_plan(cfg, args, unfilled=True)[1]), indent=2))
    return 0


def local_runner(args: argparse.Namespace) -> LocalRunner:
    return LocalRunner(work_dir(args), on_event=lambda e: print(e.get("message", ""), file=sys.stderr, flush=True))


def cmd_apply(args: argparse.Namespace) -> int:
    local = args.local and not args.dry_run  # a local run needs no bucket or role: they stay placeholders
    cfg = config_from(args, unfilled=args.dry_run or local)  # exit 2 before packaging: no bucket or role, nothing runs
    pkg, steps = checked_plan(cfg, args, unfilled=args.dry_run or local)
    if args.dry_run:
        print(json.dumps(printable(cfg, steps), indent=2))
        return 0
    if local:
        try:
            ep = local_runner(args).apply(cfg, steps, recorder=args.open_ledger(args), port=args.local_port)
        except DeployError as exc:
            print(f"local run failed: {exc}", file=sys.stderr)
            return 1
        print(json.dumps(ep.to_dict(), indent=2))
        return 0
    try:
        outcome = executor(args).apply(cfg, steps, pkg, recorder=args.open_ledger(args))
    except DeployError as exc:
        print(f"deploy failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(outcome, indent=2, default=str))
    return 0 if outcome["status"]["status"] == "InService" else 1


def cmd_status(args: argparse.Namespace) -> int:
    print(json.dumps(executor(args).status(args.endpoint), indent=2, default=str))
    return 0


def cmd_invoke(args: argparse.Namespace) -> int:
    body = Path(args.body[1:]).read_bytes() if args.body.startswith("@") else args.body.encode()
    try:
        out = executor(args).invoke(args.endpoint, body, runtime_url=args.runtime_url)
    except DeployError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    sys.stdout.write(out.decode() + "\n")
    return 0


def cmd_destroy(args: argparse.Namespace) -> int:
    ledger = args.open_ledger(args)
    if args.local:
        try:
            print(local_runner(args).destroy(args.endpoint, args.endpoint, recorder=ledger))
        except DeployError as exc:
            print(f"destroy failed: {exc}", file=sys.stderr)
            return 1
        return 0
    config, model = ledger.names(args.endpoint) or (f"{args.endpoint}-config", f"{args.endpoint}-model")
    try:
        done = executor(args).destroy(args.endpoint, config, model, recorder=ledger)
    except DeployError as exc:
        print(f"destroy failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(done, indent=2))
    return 0


def cmd_transform(args: argparse.Namespace) -> int:
    where: DeployConfig | TransformSite
    if args.model_name:  # the model has its role and image: the job needs only the region and the bucket
        where = site_from(args, unfilled=args.dry_run)
    else:
        where = config_from(args, unfilled=args.dry_run)
    try:
        text = sys.stdin.read() if args.input == "-" else Path(args.input).read_text(encoding="utf-8")
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        job = prepare_transform(rows, work_dir(args) / "transform", name=args.job_name or "", prefix=where.prefix,
                                n_parts=args.parts, model_name=args.model_name or "", instance_type=args.instance_type,
                                instance_count=args.instance_count, max_concurrent_transforms=args.max_concurrent,
                                max_payload_mb=args.max_payload_mb, batch_strategy=args.batch_strategy)
        pkg = build_package(where, work_dir(args)) if isinstance(where, DeployConfig) else None
        steps = transform_plan(where, job, pkg)
    except (ValueError, OSError) as exc:  # json.JSONDecodeError is a ValueError
        print(f"cannot plan the transform: {exc}", file=sys.stderr)
        return 2
    errors = validate_plan(steps, where.region, allow_account_placeholder=True, allow_form_placeholders=args.dry_run)
    model = job.model_name or (where.model_name if isinstance(where, DeployConfig) else "")
    plan: dict[str, Any] = {"job": job.name, "model": model, "rows": sum(len(p.ids) for p in job.parts),
                            "calls": [{"n": i, "call": f"{s.service}.{s.operation}", "why": s.description,
                                       "params": s.params} for i, s in enumerate(steps, 1)]}
    if unfilled_notes(steps):
        plan["unfilled"] = unfilled_notes(steps)
    if errors:
        print("the plan is invalid:\n  " + "\n  ".join(errors), file=sys.stderr)
        return 2
    if args.dry_run:
        print(json.dumps(plan, indent=2))
        return 0
    print(json.dumps(plan, indent=2), file=sys.stderr)
    try:
        results = executor(args).run_transform(where, job, steps)
    except DeployError as exc:
        print(f"transform failed: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write("".join(json.dumps(r) + "\n" for r in results))
    return 0


def add_audit_file_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--audit-log", default=DeploySettings.from_env().audit_log,
                   help="JSON-lines audit file (default: SEMIF_DEPLOY_AUDIT_LOG or var/deploy-audit.jsonl)")


def open_audit_file(args: argparse.Namespace) -> Ledger:
    return AuditFile(args.audit_log)


def main(argv: list[str] | None = None, *, prog: str = "python -m deploy", description: str = __doc__,
         add_ledger_args: Callable[[argparse.ArgumentParser], None] = add_audit_file_args,
         open_ledger: Callable[[argparse.Namespace], Ledger] = open_audit_file) -> int:
    """The deploy CLI. Where apply/destroy are recorded is the caller's: an audit file by default,
    the workbench's SQLite from `python -m app deploy`."""
    try:
        settings = DeploySettings.from_env()
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ap = argparse.ArgumentParser(prog=prog, description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    def aws(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--region", default=settings.region, help="default: AWS_DEFAULT_REGION or us-east-1")
        p.add_argument("--endpoint-url", default=settings.aws_endpoint_url,
                       help="another AWS endpoint (default: SEMIF_AWS_ENDPOINT_URL; tests: a moto server)")
        p.add_argument("--poll", type=finite, default=15, help="seconds between status polls")
        add_ledger_args(p)
        p.add_argument("--work-dir", help="where packages and transform inputs are written (default: a temp folder)")
        return p

    def model(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--serving", "--path", dest="serving", choices=SERVINGS, default="semif",
                       help="textgen = llama.cpp DLC, semif = the SemIf adapter image (--path is the old name)")
        p.add_argument("--compute", choices=COMPUTES, default="cpu")
        p.add_argument("--bucket", help="S3 bucket for the package (default: SEMIF_DEPLOY_BUCKET; required to apply)")
        p.add_argument("--role-arn", help="SageMaker execution role ARN (default: SEMIF_SAGEMAKER_ROLE_ARN; "
                                          "required to apply)")
        p.add_argument("--codebuild-role-arn", help="CodeBuild service role ARN (default: SEMIF_CODEBUILD_ROLE_ARN; "
                                                    "required to apply --serving semif without --image-uri)")
        p.add_argument("--account-id", help="default: from STS at apply time")
        p.add_argument("--model", help="GGUF to package (default: the shipped model)")
        p.add_argument("--policy", help="calibrated policy JSON to ship inside model.tar.gz")
        p.add_argument("--image-uri", help="a prebuilt SemIf image (skips CodeBuild)")
        p.add_argument("--ctx-size", type=int, default=8192)
        p.add_argument("--suffix", help="name suffix (default: time + random)")
        return p

    def endpoint(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--instance-type", default=DEFAULT_CPU_INSTANCE, help="CPU instance type")
        p.add_argument("--instance-count", type=int, default=1)
        p.add_argument("--pool", action="append", help="GPU pool entry TYPE:PRIORITY (repeat; default g6e>g6>g5>g4dn)")
        p.add_argument("--startup-timeout", type=int, default=600)
        p.add_argument("--download-timeout", type=int, default=900)
        p.add_argument("--provision-timeout", type=int, default=1800)
        p.add_argument("--autoscale-max", type=int, default=0, help="autoscaling: most instances (0 = no autoscaling)")
        p.add_argument("--autoscale-min", type=int, default=1, help="autoscaling: fewest instances")
        p.add_argument("--decisions-per-second", type=finite, help="measured per instance (default: per family)")
        p.add_argument("--utilisation", type=finite, default=0.7, help="share of that throughput to aim for")
        p.add_argument("--scale-in-cooldown", type=int, default=300)
        p.add_argument("--scale-out-cooldown", type=int, default=60)
        return p

    endpoint(model(aws(sub.add_parser("plan", help="print the validated plan")))).set_defaults(fn=cmd_plan)
    p = endpoint(model(aws(sub.add_parser("apply", help="run the plan"))))
    p.add_argument("--dry-run", action="store_true", help="print the plan and call nothing")
    p.add_argument("--local", action="store_true", help="run the plan's model.tar.gz and environment in the local "
                   "SemIf image (podman; SEMIF_IMAGE, default localhost/semif:dev - make image builds it) instead of AWS")
    p.add_argument("--local-port", type=int, help="with --local: the port on 127.0.0.1 (default: a free one)")
    p.set_defaults(fn=cmd_apply)
    p = aws(sub.add_parser("status"))
    p.add_argument("endpoint")
    p.set_defaults(fn=cmd_status)
    p = aws(sub.add_parser("invoke"))
    p.add_argument("endpoint")
    p.add_argument("--body", required=True, help="JSON text, or @file")
    p.add_argument("--runtime-url", help="sagemaker-runtime endpoint URL (tests: the local shim)")
    p.set_defaults(fn=cmd_invoke)
    p = aws(sub.add_parser("destroy"))
    p.add_argument("endpoint")
    p.add_argument("--local", action="store_true", help="stop and remove the local container apply --local started")
    p.set_defaults(fn=cmd_destroy)
    p = model(aws(sub.add_parser("transform", help="Batch Transform decision rows; results JSONL on stdout")))
    p.add_argument("--input", required=True, help="decision rows, one JSON object per line (- = stdin)")
    p.add_argument("--model-name", help="reuse this SageMaker model (default: create one from the package)")
    p.add_argument("--job-name", help="default: semif-tf-<time+random>")
    p.add_argument("--instance-type", default=DEFAULT_TRANSFORM_INSTANCE, help="CPU or GPU, e.g. ml.g4dn.xlarge")
    p.add_argument("--instance-count", type=int, default=1)
    p.add_argument("--parts", type=int, default=0, help="input files (default: one per instance)")
    p.add_argument("--max-concurrent", type=int, default=1, help="MaxConcurrentTransforms")
    p.add_argument("--max-payload-mb", type=int, default=1, help="MaxPayloadInMB per MultiRecord batch")
    p.add_argument("--batch-strategy", choices=["MultiRecord", "SingleRecord"], default="MultiRecord")
    p.add_argument("--dry-run", action="store_true", help="print the plan and call nothing")
    p.set_defaults(fn=cmd_transform)
    args = ap.parse_args(argv)
    args.open_ledger, args.settings = open_ledger, settings
    return int(args.fn(args))
