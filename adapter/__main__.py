"""python -m adapter {serve,score,check,models}

serve   the SemIf adapter (SageMaker runs `docker run IMAGE serve`): port from --port, else
        SAGEMAKER_BIND_TO_PORT, else 8080; --port 0 picks a free one and prints it
score   offline scoring: rows.jsonl (one decision row or {state, questions} per line) -> JSONL on
        stdout, a progress bar on stderr
check   load the model and score one case (catches a broken llama.cpp build)
models  the shipped model catalog (size, sha256, licence, source, measured accuracy) and the selection
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from pydantic import ValidationError
from tqdm import tqdm

from adapter.engine.catalog import DEFAULT_SHIPPED, ShippedModel
from adapter.server.decision_log import DecisionLogSettings
from adapter.engine.engine import Engine, EngineConfig
from adapter.json_text import SURROGATE_MSG, lone_surrogate
from adapter.engine.models import CACHE_DIR, SHIPPED, ModelNotFound, chunk_file, resolve_model, shipped_path
from adapter.server.process import serve
from adapter.schema import READOUTS, DecisionRequest, SharedStateRequest, errors_from
from adapter.server.settings import AdapterSettings
from adapter.env_settings import SettingsError
from adapter.engine.templates import load_template, request_for


def _engine(args: argparse.Namespace) -> Engine:
    cfg = EngineConfig.from_env()  # flags override their variable; every other setting is kept
    if getattr(args, "ctx_size", None):
        cfg = replace(cfg, n_ctx=args.ctx_size)
    if getattr(args, "threads", None):
        cfg = replace(cfg, n_threads=args.threads)
    return Engine(args.model, cfg)


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        settings = AdapterSettings.from_env()
        DecisionLogSettings.from_env()  # checked before the model loads: a bad log path is named at once
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    flags = {"port": args.port, "host": args.host or None, "log_level": args.log_level or None}
    settings = settings.model_copy(update={k: v for k, v in flags.items() if v is not None})  # a flag beats its variable
    try:
        return serve(settings, lambda: _engine(args))
    except SettingsError as exc:  # the decision log's file could not be opened after all: the same one line
        print(f"error: {exc}", file=sys.stderr)
        return 2


def cmd_score(args: argparse.Namespace) -> int:
    src = sys.stdin if args.rows == "-" else open(args.rows, encoding="utf-8")
    items: list[SharedStateRequest | DecisionRequest] = []
    bad: list[str] = []
    for n, line in enumerate(src, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            where = lone_surrogate(obj)  # the body text rule, as on /invocations
            if where is not None:
                bad.append(f"line {n}: {'.'.join(map(str, where)) or '(root)'}: {SURROGATE_MSG}")
                continue
            if isinstance(obj, dict):
                for q in obj.get("questions", [obj]) if "questions" in obj else [obj]:
                    if args.readout and isinstance(q, dict):
                        q.setdefault("readout", args.readout)
                    if args.permute and isinstance(q, dict):
                        q["permute"] = True
            items.append(SharedStateRequest.model_validate(obj) if isinstance(obj, dict) and "questions" in obj
                         else DecisionRequest.model_validate(obj))
        except json.JSONDecodeError as exc:
            bad.append(f"line {n}: not valid JSON ({exc.msg})")
        except ValidationError as exc:
            bad.extend(f"line {n}: {'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors_from(exc))
    if bad:
        print("no rows scored; fix these first:\n  " + "\n  ".join(bad[:50]), file=sys.stderr)
        return 2
    engine = _engine(args)
    total = sum(len(i.questions) if isinstance(i, SharedStateRequest) else 1 for i in items)
    out = sys.stdout
    with tqdm(total=total, unit="row", file=sys.stderr, disable=args.quiet) as bar:
        for item in items:
            results = engine.score_shared(item) if isinstance(item, SharedStateRequest) else [engine.score(item, fresh=args.fresh)]
            for r in results:
                out.write(json.dumps(r.public(), ensure_ascii=False, allow_nan=False) + "\n")
                bar.update(1)
            out.flush()
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    engine = _engine(args)
    policy = load_template("ticket-routing")
    r = engine.score(request_for(policy, "After a password reset my account is locked and I cannot sign in.", "check"))
    print(json.dumps({"ok": True, "model": engine.info.file, "readout": r.readout, "debias": r.debias,
                      "top_option": r.top_option,
                      "probabilities": dict(zip(r.option_ids, [round(p, 4) for p in r.probabilities])),
                      "label_mass": round(r.label_mass or 0, 4), "seconds": round(r.total_seconds or 0, 3)}))
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    """The shipped catalog (size, sha256, licence, source, what we measured) and which model is selected.
    --assemble [NAME ...] assembles and verifies chunked models now (all of them without names)."""
    wanted = set(args.assemble or SHIPPED) if args.assemble is not None else set()
    unknown = wanted - set(SHIPPED)
    if unknown:
        print(f"--assemble: unknown model(s) {', '.join(sorted(unknown))}; choose from {', '.join(SHIPPED)}")
        return 2
    failed = False
    for name, m in SHIPPED.items():
        try:
            where = str(shipped_path(name)) if (name in wanted or not m.chunks) else _chunk_status(m)
        except ModelNotFound as exc:
            where, failed = f"NOT AVAILABLE - {exc}", failed or name in wanted
        print(f"{name}{'  (default)' if name == DEFAULT_SHIPPED else ''}\n"
              f"  {m.title}: {m.size_text}, sha256 {m.sha256 or 'not pinned (single-file package)'}, "
              f"released {m.release_date}\n"
              f"  licence: {m.license}\n  source: {m.source}\n"
              f"  default readout {m.default_readout}, debias {m.default_debias}; {m.role}\n"
              f"  measured: {m.measured}\n  file: {where}")
    if args.model:
        try:
            c = resolve_model(args.model)
            print(f"selected: {c.path} (source: {c.source})")
        except ModelNotFound as exc:
            print(f"selected: none - {exc}")
            return 1
    return 1 if failed else 0


def _chunk_status(m: ShippedModel) -> str:
    for c in m.chunks:
        chunk_file(c)  # raises ModelNotFound naming the package
    target = CACHE_DIR / "models" / m.file_name
    return str(target) if target.is_file() else f"{len(m.chunks)} chunk packages installed; assembled on first use"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m adapter", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--model", help="GGUF path or shipped model name (default: SEMIF_MODEL, /opt/ml/model, qwen2.5-coder-1.5b)")
        p.add_argument("--ctx-size", type=int, help="context tokens (SM_SEMIF_CTX_SIZE)")
        p.add_argument("--threads", type=int, help="CPU threads (SM_SEMIF_THREADS)")
        return p

    s = common(sub.add_parser("serve", help="HTTP adapter"))
    s.add_argument("--host", help="bind address (SM_SEMIF_HOST; default 127.0.0.1, the container image sets 0.0.0.0)")
    s.add_argument("--port", type=int, help="0 = any free port (printed as SEMIF_ADAPTER_PORT=N)")
    s.add_argument("--log-level", help="SM_SEMIF_LOG_LEVEL, default info")
    s.set_defaults(fn=cmd_serve)
    s = common(sub.add_parser("score", help="score rows.jsonl to stdout"))
    s.add_argument("rows", help="JSONL file, or - for stdin")
    s.add_argument("--readout", choices=READOUTS, help="override rows without a readout")
    s.add_argument("--permute", action="store_true", help="permutation averaging for every row")
    s.add_argument("--fresh", action="store_true", help="clear the cache before each row (reference path)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(fn=cmd_score)
    common(sub.add_parser("check", help="load the model and score one case")).set_defaults(fn=cmd_check)
    s = common(sub.add_parser("models", help="the shipped model catalog and which model is selected"))
    s.add_argument("--assemble", nargs="*", metavar="NAME",
                   help="assemble and sha256-verify chunked shipped models now (all, or the ones named)")
    s.set_defaults(fn=cmd_models)
    args = ap.parse_args(argv)
    code: int = args.fn(args)  # one of the cmd_* functions above
    return code


if __name__ == "__main__":
    sys.exit(main())
