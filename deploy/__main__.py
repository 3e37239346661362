"""python -m deploy {plan,apply,status,invoke,destroy}

plan     print the validated plan as JSON; calls no AWS API
apply    package, upload, (build the SemIf image,) create the endpoint and wait; --dry-run = plan
status   endpoint status, failure reason, which GPU pool won
invoke   send one request body to the endpoint (sagemaker-runtime)
destroy  delete endpoint, endpoint config and model (reverse order)

Every apply/destroy is recorded in the workbench's SQLite (deployments + audit log), and a live
endpoint becomes a target in the Playground.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from .config import COMPUTES, DEFAULT_POOLS, PATHS, DeployConfig
from .plan import default_package, deployment_plan
from .validate import validate_plan


def config_from(args) -> DeployConfig:
    pools = DEFAULT_POOLS
    if args.pool:
        pools = []
        for item in args.pool:
            t, _, p = item.partition(":")
            if not p.isdigit():
                raise SystemExit(f"--pool {item!r}: write TYPE:PRIORITY, e.g. ml.g6.xlarge:1")
            pools.append((t, int(p)))
    return DeployConfig(region=args.region, bucket=args.bucket, role_arn=args.role_arn, path=args.path,
                        compute=args.compute, model_path=args.model or "", policy_path=args.policy or "",
                        codebuild_role_arn=args.codebuild_role_arn or "", account_id=args.account_id or "<account-id>",
                        instance_type=args.instance_type, pools=pools, ctx_size=args.ctx_size,
                        image_uri=args.image_uri or "", startup_timeout=args.startup_timeout,
                        download_timeout=args.download_timeout, provision_timeout=args.provision_timeout,
                        **({"name_suffix": args.suffix} if args.suffix else {}))


def checked_plan(cfg: DeployConfig) -> list:
    steps = deployment_plan(cfg, default_package(cfg))
    errors = validate_plan(steps, cfg.region)
    if errors:
        print("the plan is invalid:\n  " + "\n  ".join(errors), file=sys.stderr)
        raise SystemExit(2)
    return steps


def printable(cfg: DeployConfig, steps) -> dict:
    from .pricing import hint

    return {"deployment_id": cfg.deployment_id, "endpoint": cfg.endpoint_name, "region": cfg.region,
            "path": cfg.path, "compute": cfg.compute, "cost_hint": hint(cfg),
            "calls": [{"n": i, "call": f"{s.service}.{s.operation}", "why": s.description, "params": s.params}
                      for i, s in enumerate(steps, 1)]}


def store(args):
    from app.store import Store

    return Store(args.db)


def executor(args, on_event=None):
    from .executor import Executor

    def show(e):
        if e.get("phase") != "upload" or e["sent"] == e["total"]:
            print(f"[{e.get('index', '-')}/{e.get('total', '-')}] {e.get('message', '')}", file=sys.stderr, flush=True)

    return Executor(args.region, endpoint_url=args.endpoint_url, poll_seconds=args.poll, on_event=on_event or show)


def cmd_plan(args) -> int:
    cfg = config_from(args)
    print(json.dumps(printable(cfg, checked_plan(cfg)), indent=2))
    return 0


def cmd_apply(args) -> int:
    from .executor import DeployError
    from .records import apply_and_record

    cfg = config_from(args)
    steps = checked_plan(cfg)
    if args.dry_run:
        print(json.dumps(printable(cfg, steps), indent=2))
        return 0
    try:
        outcome = apply_and_record(store(args), cfg, printable(cfg, steps)["calls"], executor(args),
                                   runtime_url=os.environ.get("SEMIF_AWS_RUNTIME_URL") or args.endpoint_url)
    except DeployError as exc:
        print(f"deploy failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(outcome, indent=2, default=str))
    return 0 if outcome["status"]["status"] == "InService" else 1


def cmd_status(args) -> int:
    print(json.dumps(executor(args).status(args.endpoint), indent=2, default=str))
    return 0


def cmd_invoke(args) -> int:
    from .executor import DeployError

    body = open(args.body[1:], "rb").read() if args.body.startswith("@") else args.body.encode()
    try:
        out = executor(args).invoke(args.endpoint, body, runtime_url=args.runtime_url)
    except DeployError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    sys.stdout.write(out.decode() + "\n")
    return 0


def cmd_destroy(args) -> int:
    from .executor import DeployError
    from .records import destroy_and_record

    try:
        done = destroy_and_record(store(args), args.endpoint, executor(args))
    except DeployError as exc:
        print(f"destroy failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(done, indent=2))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m deploy", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    def aws(p):
        p.add_argument("--region", default=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
        p.add_argument("--endpoint-url", default=os.environ.get("SEMIF_AWS_ENDPOINT_URL"),
                       help="another AWS endpoint (tests: a moto server)")
        p.add_argument("--poll", type=float, default=15, help="seconds between status polls")
        p.add_argument("--db", help="workbench SQLite (default: SEMIF_DB or data/workbench.db)")
        return p

    def shape(p):
        p.add_argument("--path", choices=PATHS, default="semif")
        p.add_argument("--compute", choices=COMPUTES, default="cpu")
        p.add_argument("--bucket", default=os.environ.get("SEMIF_DEPLOY_BUCKET", "my-semif-models"))
        p.add_argument("--role-arn", default=os.environ.get("SEMIF_SAGEMAKER_ROLE_ARN",
                                                            "arn:aws:iam::123456789012:role/SageMakerExecution"))
        p.add_argument("--codebuild-role-arn", default=os.environ.get("SEMIF_CODEBUILD_ROLE_ARN",
                                                                      "arn:aws:iam::123456789012:role/CodeBuildDocker"))
        p.add_argument("--account-id", help="default: from STS at apply time")
        p.add_argument("--model", help="GGUF to package (default: the shipped model)")
        p.add_argument("--policy", help="calibrated policy JSON to ship inside model.tar.gz")
        p.add_argument("--instance-type", default="ml.c7i.xlarge", help="CPU instance type")
        p.add_argument("--pool", action="append", help="GPU pool entry TYPE:PRIORITY (repeat; default g6e>g6>g5>g4dn)")
        p.add_argument("--image-uri", help="a prebuilt SemIf image (skips CodeBuild)")
        p.add_argument("--ctx-size", type=int, default=4096)
        p.add_argument("--startup-timeout", type=int, default=600)
        p.add_argument("--download-timeout", type=int, default=900)
        p.add_argument("--provision-timeout", type=int, default=1800)
        p.add_argument("--suffix", help="name suffix (default: time + random)")
        return p

    shape(aws(sub.add_parser("plan", help="print the validated plan"))).set_defaults(fn=cmd_plan)
    p = shape(aws(sub.add_parser("apply", help="run the plan")))
    p.add_argument("--dry-run", action="store_true", help="print the plan and call nothing")
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
    p.set_defaults(fn=cmd_destroy)
    args = ap.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
