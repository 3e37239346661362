"""The hidden states `python -m bench.labels` simulates on: every row of each shipped labeled set, read ONCE
by the default model in the head layout (the policy first, the state last), appended to a JSONL cache as
each row is read (a killed run resumes). Not a test.

Rows are read round-robin over the sets in a fixed shuffled order per set (row 1 of each set, then row 2,
...), so a stopped run leaves every set with about the same number of rows, a fair sample of its labels. Run beside other work with SM_SEMIF_THREADS=1 OPENBLAS_NUM_THREADS=1.

Run: .venv/bin/python -m bench.label_states [--cache PATH] [--limit N] [--model qwen2.5-coder-1.5b]
"""
from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import numpy as np
from adapter.engine.engine import Engine, EngineConfig
from adapter.schema import HiddenState

from adapter.engine.templates import DATA_DIR, load_jsonl, load_template, request_for

DEFAULT_MODEL = "qwen2.5-coder-1.5b"
DEFAULT_CACHE = Path("/work/notes/issue44-label-states.jsonl")


def shipped_sets() -> dict[str, list[dict]]:
    """Every row (train and test split) of each shipped labeled set, in file order."""
    return {p.stem: list(load_jsonl(p)) for p in sorted((DATA_DIR / "labeled").glob("*.jsonl"))}


def shuffled(rows: list[dict]) -> list[dict]:
    """A set's rows in the fixed order they are read in (a set file may be sorted by label)."""
    return [rows[i] for i in np.random.default_rng(0).permutation(len(rows))]


def load_cache(path: Path) -> dict[tuple[str, str], dict]:
    """{(set, row id): record} from the cache; a torn last line (a killed write) is skipped."""
    out: dict[tuple[str, str], dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            out[(r["set"], r["id"])] = r
    return out


def states(path: Path = DEFAULT_CACHE) -> dict[str, tuple[list[str], np.ndarray, np.ndarray, list[str]]]:
    """{set: (row ids, hidden states (n, d) float32, label indices (n,), option ids)} from the cache."""
    cached = load_cache(path)
    by_set: dict[str, list[dict]] = {}
    for name, rows in shipped_sets().items():  # the shuffled order's longest prefix read so far: a fair sample
        for row in shuffled(rows):
            if (name, row["id"]) not in cached:
                break
            by_set.setdefault(name, []).append(cached[(name, row["id"])])
    out = {}
    for name, recs in sorted(by_set.items()):
        options = recs[0]["options"]
        X = np.stack([HiddenState.model_validate(r["hidden"]).array().astype(np.float32) for r in recs])
        y = np.array([options.index(r["label"]) for r in recs])
        out[name] = ([r["id"] for r in recs], X, y, options)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default=str(DEFAULT_CACHE))
    ap.add_argument("--limit", type=int, default=0, help="at most N rows a set (0: all)")
    ap.add_argument("--model", default=DEFAULT_MODEL)
    args = ap.parse_args()
    cache = Path(args.cache)
    cache.parent.mkdir(parents=True, exist_ok=True)
    done = load_cache(cache)
    sets = shipped_sets()
    # a fixed shuffle per set (a set file may be sorted by label): a stopped run leaves a fair sample of each
    sets = {k: shuffled(v) for k, v in sets.items()}
    if args.limit:
        sets = {k: v[: args.limit] for k, v in sets.items()}
    policies = {name: load_template(name) for name in sets}
    engine = Engine(args.model, EngineConfig.from_env())
    todo = [(name, row) for group in itertools.zip_longest(*[[(n, r) for r in rows] for n, rows in sets.items()])
            for name, row in (g for g in group if g is not None) if (name, row["id"]) not in done]
    t0 = time.perf_counter()
    for i, (name, row) in enumerate(todo, 1):
        req = request_for(policies[name], row["state"], row["id"], hidden_state=True).in_head_layout()
        r = engine.score(req)
        rec = {"set": name, "id": row["id"], "split": row.get("split"), "label": row["label"],
               "options": r.option_ids, "probs": r.probabilities, "sha256": r.model["sha256"],
               "prompt_version": r.prompt_version, "hidden": r.hidden_state.model_dump() if r.hidden_state else None}
        with cache.open("a") as fh:
            fh.write(json.dumps(rec) + "\n")
        if i % 20 == 0 or i == len(todo):
            print(f"{i}/{len(todo)} rows, {(time.perf_counter() - t0) / i:.2f} s a row", flush=True)


if __name__ == "__main__":
    main()
