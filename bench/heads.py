"""Do labeled rows buy accuracy, and how cheaply? Zero-shot, today's learned head and the fast head.

Not a test. On each shipped labeled set (its test split):
- the default model as it decides zero-shot (letters + content-free, the state first), with its hidden state:
  zero-shot accuracy, the best correction Calibrate would pick, and today's hidden-state head on it;
- the *head layout* (adapter/prompt.render_policy_first: the question and options first, cached once per
  policy, the state last) on every shipped local model that reads it: each model's hidden-state head.
Every accuracy is out of fold over stratified folds (heads: as many folds as the rarest option has rows,
up to 5 - app/core/heads.head_folds), with its Wilson 95% interval; a head that cannot be fitted is shown
as refused with why, never as 0%, and left out of the pooled row (which says on how many sets it rests).
The recommendation per set is the Calibrate page's rule (app/core/head_sources): the cheapest candidate
not worse beyond noise than the most accurate. Tokens and seconds a row are measured in one run,
interleaved over the sources (each source its own warm engine, as a deployed adapter keeps its policy's
prefix warm), so their ratios hold on a noisy machine.

Scored rows are cached in var/bench-heads-v2.jsonl (a killed run resumes). The table is published to
docs/benchmarks.md (bench/report.py).

Run: .venv/bin/python -m bench.heads [--limit N] [--timing-rows 8] [--models ...] [--no-publish]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from adapter.engine.engine import Engine, EngineConfig
from adapter.schema import HEAD_LAYOUT, HiddenState
from adapter.engine.templates import load_template, request_for
from app.core import calibration, head_sources, heads
from app.core.stats import proportion
from bench.models import test_rows
from bench.report import publish

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = "qwen2.5-coder-1.5b"
HEAD_MODELS = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2")


@dataclass(frozen=True)
class Source:
    model: str
    layout: str  # "state-first" (the model's default readout, zero-shot) | HEAD_LAYOUT

    @property
    def key(self) -> str:
        return f"{self.model}|{self.layout}"

    @property
    def label(self) -> str:
        return f"{self.model} zero-shot (state first)" if self.layout != HEAD_LAYOUT else f"{self.model} head layout"

    def request(self, policy: dict, state, row_id: str):
        req = request_for(policy, state, row_id, hidden_state=True)
        return req.in_head_layout() if self.layout == HEAD_LAYOUT else req


def sources(models: list[str]) -> list[Source]:
    return [Source(DEFAULT_MODEL, "state-first"), *(Source(m, HEAD_LAYOUT) for m in models)]


def score_sets(engines: dict[str, Engine], srcs: list[Source], sets: dict[str, list[dict]], cache: Path) -> dict:
    done: dict[tuple, dict] = {}
    if cache.exists():
        for line in cache.read_text().splitlines():
            r = json.loads(line)
            done[tuple(r["key"])] = r
    for src in srcs:
        for set_name, rows in sets.items():
            policy = load_template(set_name)
            todo = [row for row in rows if (src.key, set_name, row["id"]) not in done]
            for n, row in enumerate(todo, 1):
                r = engine_for(engines, src).score(src.request(policy, row["state"], row["id"]))
                rec = {"key": [src.key, set_name, row["id"]], "label": row["label"], "options": r.option_ids,
                       "probs": r.probabilities, "uncorrected": r.uncorrected_probabilities, "debias": r.debias,
                       "prompt_version": r.prompt_version, "sha256": r.model["sha256"], "file": r.model["file"],
                       "evaluated_tokens": r.evaluated_tokens,
                       "hidden": r.hidden_state.model_dump() if r.hidden_state else None}
                done[tuple(rec["key"])] = rec
                with cache.open("a") as fh:
                    fh.write(json.dumps(rec) + "\n")
                if n % 16 == 0 or n == len(todo):
                    print(f"{src.label} · {set_name}: {n}/{len(todo)}", flush=True)
    return done


def engine_for(engines: dict[str, Engine], src: Source) -> Engine:
    """One engine per source: each keeps its own policy prefix warm, as a deployed adapter does."""
    if src.key not in engines:
        engines[src.key] = Engine(src.model, EngineConfig.from_env())
    return engines[src.key]


def time_sources(engines: dict[str, Engine], srcs: list[Source], rows: list[dict], policy: dict
                 ) -> dict[str, tuple[float, float]]:
    """{source: (median seconds, median evaluated tokens)} a warm decision, every row on every source in a
    rotating order (no source always goes first), after one warm-up row each."""
    for src in srcs:
        engine_for(engines, src).score(src.request(policy, rows[0]["state"], "warm"))
    took: dict[str, list[float]] = {s.key: [] for s in srcs}
    toks: dict[str, list[float]] = {s.key: [] for s in srcs}
    for i, row in enumerate(rows):
        for j in range(len(srcs)):
            src = srcs[(i + j) % len(srcs)]
            t0 = time.perf_counter()
            r = engine_for(engines, src).score(src.request(policy, row["state"], f"t{i}"))
            took[src.key].append(time.perf_counter() - t0)
            toks[src.key].append(float(r.evaluated_tokens or 0))
    return {k: (statistics.median(took[k]), statistics.median(toks[k])) for k in took}


def evaluate_set(recs_by_source: dict[str, list[dict]], timing: dict[str, tuple[float, float]], seed: int = 0) -> dict:
    """Per source: its candidates (as scored, the best correction, the hidden-state head), paired, and the pick."""
    cands: list[head_sources.Candidate] = []
    notes: dict[str, str] = {}
    for key, recs in recs_by_source.items():
        model, layout = key.split("|")
        ids = recs[0]["options"]
        y = np.array([ids.index(r["label"]) for r in recs])
        keys = [r["key"][2] for r in recs]
        P = np.array([r["probs"] for r in recs])
        H = np.array([HiddenState.model_validate(r["hidden"]).array() for r in recs])
        fits = heads.candidates(H, P, y, option_ids=ids, model_sha256=recs[0]["sha256"],
                                prompt_version=recs[0]["prompt_version"], seed=seed)
        hidden = next(f for f in fits if f.kind == "hidden")
        tokens = float(statistics.median(r["evaluated_tokens"] or 0 for r in recs))
        seconds = timing[key][0] if key in timing else tokens / 1000  # untimed: tokens stand in for the cost

        def make(method: str, kind: str, probs: np.ndarray | None, refused: str = "", model: str = model,
                 layout: str = layout, y: np.ndarray = y, keys: list[str] = keys, seconds=seconds,
                 tokens: float = tokens) -> head_sources.Candidate:
            pred = {} if probs is None else dict(zip(keys, (int(v) for v in calibration.predictions(probs))))
            labels = dict(zip(keys, (int(v) for v in y)))
            return head_sources.Candidate(0, model, layout, method, kind, {k: pred[k] == labels[k] for k in pred},
                                          pred, labels, seconds, tokens, refused)

        if layout != HEAD_LAYOUT:
            fams = {recs[0]["debias"] or "none": P}
            if all(r["uncorrected"] for r in recs):
                fams["none"] = np.array([r["uncorrected"] for r in recs])
            best, _ = calibration.choose_correction(calibration.corrections(fams, y, seed=seed), len(y))
            cands += [make("zero-shot", "zero-shot", P), make("best correction", "correction", best.oof)]
        cands.append(make("hidden-state head", "head", hidden.oof, refused="" if hidden.available else hidden.note))
        if not hidden.available:
            notes[key] = hidden.note
    table = head_sources.compare(cands, seed=seed)
    return {"table": table, "notes": notes, "n": table.n, "recs": recs_by_source}


def cell(row: head_sources.Row | None) -> str:
    if row is None:
        return "—"
    if row.accuracy is None:
        return "refused"
    return f"{row.accuracy.rate:.1%} ({row.accuracy.low:.0%}–{row.accuracy.high:.0%})"


COLUMNS = (("zero-shot", "state-first", "zero-shot"), ("correction", "state-first", "best correction"),
           ("head", "state-first", "today's head"))


def find(table: head_sources.Table, model: str, layout: str, kind: str) -> head_sources.Row | None:
    return next((r for r in table.rows if r.candidate.model == model and r.candidate.layout == layout
                 and r.candidate.kind == kind), None)


def report(results: dict[str, dict], srcs: list[Source], timing: dict[str, tuple[float, float]], when: str,
           rows_note: str = "every test row of each shipped set") -> str:
    head_srcs = [s for s in srcs if s.layout == HEAD_LAYOUT]
    cols = [f"{DEFAULT_MODEL} zero-shot", "best correction", "today's head (state first)",
            *(f"{s.model} head layout" for s in head_srcs)]
    lines = ["| set | rows | " + " | ".join(cols) + " | recommended (cheapest that may stand in for the most accurate) |",
             "|" + "---|" * (len(cols) + 3)]
    pooled: dict[str, list[np.ndarray]] = {c: [] for c in cols}
    refused_sets: dict[str, list[str]] = {c: [] for c in cols}
    for name, res in results.items():
        t: head_sources.Table = res["table"]
        found = [find(t, DEFAULT_MODEL, "state-first", k) for k, _, _ in COLUMNS]
        found += [find(t, s.model, HEAD_LAYOUT, "head") for s in head_srcs]
        for c, row in zip(cols, found):
            if row is None or row.accuracy is None:
                refused_sets[c].append(name)
            else:
                keys = sorted(row.candidate.right)
                pooled[c].append(np.array([row.candidate.right[k] for k in keys], bool))
        rec = t.recommended
        pick = "—" if rec is None else (f"{rec.candidate.model} · {head_sources.LAYOUT_WORDS[rec.candidate.layout]} · "
                                        f"{rec.candidate.method}" + (f" ({rec.speedup:.1f}× cheaper)" if rec.speedup
                                                                     and rec.speedup > 1 else ""))
        lines.append(f"| {name} | {res['n']} | " + " | ".join(cell(r) for r in found) + f" | {pick} |")
    pooled_cells = []
    for c in cols:
        if not pooled[c]:
            pooled_cells.append("refused")
            continue
        right = np.concatenate(pooled[c])
        p = proportion(int(right.sum()), len(right))
        scope = f" ({len(pooled[c])} of {len(results)} sets)" if refused_sets[c] else ""
        pooled_cells.append(f"**{p.rate:.1%}** ({p.low:.0%}–{p.high:.0%}){scope}")
    lines.append(f"| **all** | {sum(r['n'] for r in results.values())} | " + " | ".join(pooled_cells) + " | |")
    out = "\n".join(lines)
    notes = [f"{k.replace('|', ' ')} on {name} ({why.split(':')[0].removeprefix('needs ')})"
             for name, r in results.items() for k, why in r["notes"].items()]
    if notes:
        out += "\n\nRefused: " + "; ".join(notes) + "."
    base = timing.get(f"{DEFAULT_MODEL}|state-first")
    if not timing:
        tokens = {s.key: statistics.median(float(r["evaluated_tokens"] or 0) for res in results.values()
                                           for r in res.get("recs", {}).get(s.key, [])) for s in srcs
                  if any(res.get("recs", {}).get(s.key) for res in results.values())}
        out += "\n\nNot timed in this run; median tokens a row beyond the cached prefix: " + ", ".join(
            f"{s.label} {tokens[s.key]:.0f}" for s in srcs if s.key in tokens) + "."
        return out + _footer(rows_note, when)
    trows = ["| source | tokens a row (median, beyond the cached prefix) | warm seconds a row (median) | cheaper than "
             f"{DEFAULT_MODEL} zero-shot |", "|---|---|---|---|"]
    for s in srcs:
        sec, tok = timing[s.key]
        ratio = f"{base[0] / sec:.1f}×" if base else "—"
        trows.append(f"| {s.label} | {tok:.0f} | {sec:.2f} | {ratio} |")
    out += "\n\n" + "\n".join(trows)
    return out + _footer(rows_note, when)


def _footer(rows_note: str, when: str) -> str:
    return (f"\n\nAccuracy out of fold (each row predicted by a fit that never saw it; a head over as many folds as "
            "the rarest option has rows, up to 5, its L2 strength chosen by inner cross-validation), Wilson 95% "
            f"intervals, {rows_note}. 'today's head' is the hidden-state head on the default "
            "model's zero-shot prompt (letters + content-free, the state first); 'head layout' is the policy-first "
            "prompt, whose letters are never offered zero-shot. The recommendation is Calibrate's rule: the cheapest "
            "candidate whose paired deficit against the most accurate is not beyond noise (bootstrap 95% interval "
            "above zero and McNemar p < 0.05 = worse), that is at most 5 points below it as measured and not below "
            "the default model's zero-shot; without timing, cost is read as tokens a row. Timing: the same "
            f"rows on every source, interleaved in a rotating order, each source its own warm engine; {when}.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=list(HEAD_MODELS), help="models read in the head layout")
    ap.add_argument("--limit", type=int, default=0, help="evenly spaced test rows per set (0 = all)")
    ap.add_argument("--timing-rows", type=int, default=8, help="rows of each set timed on every source")
    ap.add_argument("--cache", default=str(ROOT / "var" / "bench-heads-v2.jsonl"))
    ap.add_argument("--no-publish", action="store_true")
    ap.add_argument("--scored-only", action="store_true", help="score nothing: the rows every source already has "
                                                               "in the cache (with --timing-rows 0: no timing either)")
    args = ap.parse_args()
    cache = Path(args.cache)
    cache.parent.mkdir(parents=True, exist_ok=True)
    sets = test_rows(args.limit)
    srcs = sources(args.models)
    engines: dict[str, Engine] = {}
    if args.scored_only:  # the rows every source already answered, nothing scored
        done = score_sets(engines, [], sets, cache)
        sets = {name: [r for r in rows if all((s.key, name, r["id"]) in done for s in srcs)]
                for name, rows in sets.items()}
    else:
        done = score_sets(engines, srcs, sets, cache)
    load0 = open("/proc/loadavg").read().split()[0]
    timing: dict[str, tuple[float, float]] = {}
    secs: dict[str, list[float]] = {s.key: [] for s in srcs}
    tok: dict[str, list[float]] = {s.key: [] for s in srcs}
    for set_name, rows in sets.items() if args.timing_rows else ():  # each set's rows interleaved over the sources
        step = max(1, len(rows) // max(args.timing_rows, 1))
        for key, (s, t) in time_sources(engines, srcs, rows[::step][: args.timing_rows], load_template(set_name)).items():
            secs[key].append(s)
            tok[key].append(t)
    timing = {k: (statistics.median(secs[k]), statistics.median(tok[k])) for k in secs if secs[k]}
    load1 = open("/proc/loadavg").read().split()[0]
    threads = next(iter(engines.values())).info.n_threads if engines else "-"
    when = f"{time.strftime('%Y-%m-%d')}, {threads} threads, load average {load0} → {load1}"
    results = {}
    for set_name, rows in sets.items():
        if not rows:
            print(f"{set_name}: no row has every source yet", flush=True)
            continue
        by_source = {s.key: [done[(s.key, set_name, r["id"])] for r in rows] for s in srcs}
        results[set_name] = evaluate_set(by_source, timing)
        print(f"{set_name}: {results[set_name]['table'].sentence}", flush=True)
    rows_note = (f"{args.limit} evenly spaced test rows of each shipped set (every label keeps its share)" if args.limit
                 else "every test row of each shipped set")
    text = report(results, srcs, timing, when, rows_note)
    print(text)
    if not args.no_publish:
        where = publish("heads", text)
        print(f"published to {where}")


if __name__ == "__main__":
    main()
