"""Peak resident memory (issue 45): each measured process's own peak RSS, read by `os.wait4` when it
exits (the kernel's ru_maxrss of that child) - one model process at a time.

    python -m bench.memory adapter --models qwen2.5-coder-1.5b,qwen2.5-coder-0.5b,smollm2
    python -m bench.memory calibrate --rows 3 --sources "" "local-smollm2" "local,local-qwen2.5-coder-0.5b,local-smollm2"
    python -m bench.memory workbench

`adapter`: `python -m adapter serve --port 0` answering its first /invocations decision (VmHWM read
while it runs, then ru_maxrss at exit). `calibrate`: `python -m app calibrate` on the first N test rows
of a shipped labeled set with each --head-sources value (memory comes from models and contexts, not
rows). `workbench`: the workbench's in-process engine (the EnginePool a page uses) making its first
local decision. Extra environment (e.g. SM_SEMIF_CTX_SIZE=4096) is passed through to every child.
Prints one JSON line per measurement."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.common import start_adapter
from bench.head_sources_pace import subset

ROOT = Path(__file__).resolve().parent.parent
ROW = {"id": "r1", "state": "Bought the blender 4 days ago, it will not turn on. Receipt attached.",
       "question": "Should this refund be approved?", "options": [{"id": "approve"}, {"id": "deny"},
                                                                 {"id": "human-review"}]}
WORKBENCH = """
import json
from app.targets.engines import EnginePool
from app.targets.local import LocalTarget
from adapter.schema import DecisionRequest
t = LocalTarget("local", {}, EnginePool())
req = DecisionRequest.model_validate(json.loads(%r))
print(json.dumps(t._one(req)[1].get("decision")))
"""


def _env(folder: Path) -> dict[str, str]:
    return {**os.environ, "SM_SEMIF_KV_CACHE_DIR": str(folder / "kv"), "SEMIF_DB": str(folder / "wb.db")}


def _hwm(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    return -1


def _rollup(pid: int) -> dict[str, int]:
    """Resident MB now, split into file-backed (the mmap'd GGUF) and anonymous (KV cache, buffers, Python)."""
    out = {}
    for line in open(f"/proc/{pid}/smaps_rollup"):
        key = line.split(":")[0]
        if key in ("Rss", "Anonymous"):
            out[key.lower() + "_mb"] = int(line.split()[1]) // 1024
    return out


def _wait(proc: subprocess.Popen[str]) -> tuple[int, int]:
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss // 1024


def adapter(model: str) -> dict[str, object]:
    folder = Path(tempfile.mkdtemp(prefix="semif-mem-"))
    t0 = time.perf_counter()
    proc, url = start_adapter(model, env=_env(folder))
    try:
        req = urllib.request.Request(url + "/invocations", json.dumps(ROW).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as resp:
            status = resp.status
        hwm, now = _hwm(proc.pid), _rollup(proc.pid)
    finally:
        proc.terminate()
    _, peak = _wait(proc)  # type: ignore[arg-type]
    return {"what": "adapter first decision", "model": model, "http": status, "vm_hwm_mb": hwm, **now,
            "peak_rss_mb": peak, "seconds": round(time.perf_counter() - t0, 1)}


def calibrate(sources: str, rows: int, policy: str) -> dict[str, object]:
    folder = Path(tempfile.mkdtemp(prefix="semif-mem-"))
    labeled = subset(folder, policy, rows)
    args = [sys.executable, "-m", "app", "calibrate", "--db", str(folder / "wb.db"), "--quiet", "--policy", policy,
            "--labeled-set", str(labeled), "--out", str(folder / "p.json")]
    if sources:
        args += ["--head-sources", sources]
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, cwd=ROOT, env=_env(folder), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()  # type: ignore[union-attr]
    rc, peak = _wait(proc)
    if rc:
        raise SystemExit(f"calibrate failed ({rc}):\n{out[-3000:]}")
    return {"what": "calibrate", "policy": policy, "rows": rows, "head_sources": sources, "peak_rss_mb": peak,
            "seconds": round(time.perf_counter() - t0, 1)}


def workbench() -> dict[str, object]:
    folder = Path(tempfile.mkdtemp(prefix="semif-mem-"))
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", WORKBENCH % json.dumps(ROW)], cwd=ROOT, env=_env(folder),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()  # type: ignore[union-attr]
    rc, peak = _wait(proc)
    if rc:
        raise SystemExit(f"workbench decision failed ({rc}):\n{out[-3000:]}")
    return {"what": "workbench first local decision (EnginePool, default model)", "decision": out.strip(),
            "peak_rss_mb": peak, "seconds": round(time.perf_counter() - t0, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["adapter", "calibrate", "workbench"])
    p.add_argument("--models", default="qwen2.5-coder-1.5b,qwen2.5-coder-0.5b,smollm2")
    p.add_argument("--sources", nargs="*", default=["", "local-smollm2",
                                                    "local,local-qwen2.5-coder-0.5b,local-smollm2"])
    p.add_argument("--rows", type=int, default=6)  # calibrate needs >= 4 labeled results
    p.add_argument("--policy", default="refund-check")
    a = p.parse_args()
    extra = {k: os.environ[k] for k in ("SM_SEMIF_CTX_SIZE", "SM_SEMIF_PARALLEL", "SEMIF_MAX_LOADED_MODELS")
             if k in os.environ}
    if a.what == "adapter":
        results = [adapter(m) for m in a.models.split(",")]
    elif a.what == "calibrate":
        results = [calibrate(s, a.rows, a.policy) for s in a.sources]
    else:
        results = [workbench()]
    for r in results:
        print(json.dumps({**r, "env": extra, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}), flush=True)


if __name__ == "__main__":
    main()
