"""Why a batched head-layout row is not bit-identical to the same row alone (issue 45 item 1): an experiment.

Not a test. One model process, SM_SEMIF_THREADS=1. The same head-layout rows of one policy are decoded:
- alone: `Engine._forward` (the path `row_batch` = 1 takes), the reference;
- batched: `Engine._forward_parallel` on B suffixes (the path `row_batch` = B takes);
- variants built here with llama.cpp's batch API, to tell the causes apart:
  * `one-alone-api`: one row as sequence 1 of a llama_batch (does the API path itself change bits?);
  * `batch-one-output`: B rows in one decode but only the first row's last token gives logits (the last
    layer then runs on 1 token, as alone: what is left is the first layers' batch shape);
  * `alone-B-outputs`: one row alone but its last B tokens give logits (the last layer on B tokens, as in a
    batch of B: compared with the batched row);
  * `same-row-xB`: B copies of one row in one decode (does a row's place in the batch change its bits?).
Settings that steer llama.cpp's CPU kernels are per process, so the script is run once per setting:
`--no-repack` (llama_model_params.use_extra_bufts = false: Q4_K weights not repacked for the 4-row gemm),
`GGML_CPU_TILED_MM=0` in the environment (no tiled K-quant matmul for >= 8 tokens), `--no-flash-attn`,
`--split-kv` (kv_unified = false: a KV stream per sequence instead of the one buffer the engine shares).
Results of 2026-12-07 are in docs/benchmarks.md (after the bench:throughput block).

    SM_SEMIF_THREADS=1 python -m bench.batch_bits --model smollm2 [--rows 8] [--batch 4] [--no-repack]
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--policy", default="refund-check")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--no-repack", action="store_true")
    p.add_argument("--no-flash-attn", action="store_true")
    p.add_argument("--split-kv", action="store_true", help="kv_unified = false: a KV stream per sequence")
    a = p.parse_args()

    import llama_cpp
    import llama_cpp.llama_cpp as bindings  # the module `Llama.__init__` reads its defaults from

    if a.no_repack:  # patched where Llama reads it: patching the package's re-export left repacking on (before 2026-12-07 22:00)
        default = bindings.llama_model_default_params

        def no_repack() -> Any:
            params = default()
            params.use_extra_bufts = False
            return params

        bindings.llama_model_default_params = no_repack
        llama_cpp.llama_model_default_params = no_repack  # type: ignore[assignment]
    from adapter.engine.engine import Engine, EngineConfig
    if a.split_kv:
        import llama_cpp._internals as internals

        made = internals.LlamaContext.__init__

        def split(self: Any, *args: Any, **kw: Any) -> None:
            kw["params"].kv_unified = False
            made(self, *args, **kw)

        internals.LlamaContext.__init__ = split  # type: ignore[method-assign]
    from adapter.engine.templates import load_template, request_for
    from adapter.schema import HEAD_LAYOUT
    from bench.models import test_rows

    cfg = EngineConfig.from_env()
    cfg = EngineConfig(cfg.n_ctx, cfg.n_threads, cfg.n_gpu_layers, cfg.n_batch, cfg.n_parallel,
                       not a.no_flash_attn and cfg.flash_attn, cfg.row_batch)
    eng = Engine(a.model, cfg)
    cpp = eng._llama_cpp
    policy = load_template(a.policy)
    states = [r["state"] for r in test_rows(0)[a.policy]][: a.rows]
    prepared = [eng._prepare(eng.render(request_for(policy, s, f"h{i}", layout=HEAD_LAYOUT, hidden_state=True), "letters"))
                for i, s in enumerate(states)]
    prefix = prepared[0][0][:-1]
    letters = [seq[0] for seq in prepared[0][1]]
    n_prefix = sum(len(s) for s in prefix)
    mem = cpp.llama_get_memory(eng.llm.ctx)

    def probs(logits: np.ndarray) -> np.ndarray:
        x = logits[letters].astype(np.float64)
        e = np.exp(x - x.max())
        return e / e.sum()

    def at_prefix() -> None:
        """The prefix alone in the cache, as sequence 0 (evaluated once, then kept)."""
        if eng._cached != list(prefix):
            eng.clear_cache()
            eng._prefill(prefix, 0, None)
            eng._cached = list(prefix)
        cpp.llama_memory_seq_rm(mem, -1, n_prefix, -1)
        for s in range(1, cpp.llama_n_seq_max(eng.llm.ctx)):
            cpp.llama_memory_seq_rm(mem, s, -1, -1)
        eng.llm.n_tokens = n_prefix
        eng._cached_logits = eng._cached_hidden = None

    pad_seq = cpp.llama_n_seq_max(eng.llm.ctx) - 1

    def decode(suffixes: list[tuple[int, ...]], outputs: list[set[int]], pad: int = 0, pad_outputs: int = 0,
               align: int = 0) -> tuple[list[list[np.ndarray]], list[np.ndarray], float]:
        """Suffixes as sequences 1.. of one llama_batch on the prefix; outputs[j]: the positions in suffix j
        that give logits. With `pad`, filler tokens on a sequence of their own (attending only to each other)
        make the batch a multiple of `pad` tokens, and its outputs at least `pad_outputs` (a multiple of `pad`).
        Returns (logits per suffix per output, hidden states in batch order, seconds)."""
        at_prefix()
        n_tok, n_out = sum(len(s) for s in suffixes), sum(len(o) for o in outputs)
        fill = max(0, pad_outputs - n_out)
        if pad:
            fill += (-(n_tok + fill)) % pad
            fill = max(fill, pad_outputs - n_out)
        gaps = [(-len(sf)) % align if align and j < len(suffixes) else 0 for j, sf in enumerate(suffixes, 1)]
        batch = cpp.llama_batch_init(n_tok + fill + pad + sum(gaps), 0, 1)
        n, where, filler_pos = 0, [], 0
        for j, suffix in enumerate(suffixes, 1):
            cpp.llama_memory_seq_cp(mem, 0, j, -1, -1)
            mine = []
            for i, tok in enumerate(suffix):
                batch.token[n], batch.pos[n], batch.n_seq_id[n] = tok, n_prefix + i, 1
                batch.seq_id[n][0] = j
                batch.logits[n] = i in outputs[j - 1]
                if i in outputs[j - 1]:
                    mine.append(n)
                n += 1
            where.append(mine)
            for _ in range(gaps[j - 1]):  # `align`: the next row's cells start on a multiple of `align` after the prefix
                batch.token[n], batch.pos[n], batch.n_seq_id[n] = suffix[0], filler_pos, 1
                batch.seq_id[n][0] = pad_seq
                batch.logits[n] = False
                n, filler_pos = n + 1, filler_pos + 1
        for i in range(fill):  # fillers: the first suffix's tokens again, from position 0 of their own sequence
            batch.token[n], batch.pos[n], batch.n_seq_id[n] = suffixes[0][i % len(suffixes[0])], filler_pos + i, 1
            batch.seq_id[n][0] = pad_seq
            batch.logits[n] = i >= fill - max(0, pad_outputs - n_out)
            n += 1
        batch.n_tokens = n
        eng._tap.start()
        t0 = time.perf_counter()
        try:
            eng._decode(batch, None, "experiment")
        finally:
            hidden = eng._tap.take(sum(len(w) for w in where)) or []
        sec = time.perf_counter() - t0
        out = [[np.ctypeslib.as_array(cpp.llama_get_logits_ith(eng.llm.ctx, i), shape=(eng._n_vocab,)).copy()
                for i in w] for w in where]
        cpp.llama_batch_free(batch)
        at_prefix()
        return out, hidden, sec

    report: dict[str, Any] = {"model": a.model, "repack": not a.no_repack, "split_kv": a.split_kv, "flash_attn": eng.info.flash_attn,
                              "tiled_mm_env": os.environ.get("GGML_CPU_TILED_MM", "(default on)"),
                              "batch": a.batch, "rows": len(prepared), "suffix_tokens": [len(p[0][-1]) for p in prepared]}
    # alone, the reference (the engine's own path)
    alone, alone_h, t_alone = [], [], 0.0
    for segs, _ in prepared:
        at_prefix()
        t0 = time.perf_counter()
        logits, _, _ = eng._forward(segs, None, hidden=True)
        t_alone += time.perf_counter() - t0
        alone.append(logits)
        alone_h.append(eng._cached_hidden.copy() if eng._cached_hidden is not None else None)
    B = a.batch

    def cmp(name: str, pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
        same = sum(bool(np.array_equal(x, y)) for x, y in pairs)
        dp = max(float(np.abs(probs(x) - probs(y)).max()) for x, y in pairs)
        dl = max(float(np.abs(x - y).max()) for x, y in pairs)
        report[name] = {"bit_identical": f"{same}/{len(pairs)}", "max_abs_dprob": dp, "max_abs_dlogit": dl}

    # the engine's batched path
    together, t_batch = [], 0.0
    for k in range(0, len(prepared) - len(prepared) % B, B):
        at_prefix()
        t0 = time.perf_counter()
        logits, _, _, states = eng._forward_parallel([p[0] for p in prepared[k: k + B]], None, True)
        t_batch += time.perf_counter() - t0
        eng._drop_suffixes(B)
        together += logits
    n_b = len(together)
    cmp("engine batched vs alone", list(zip(alone[:n_b], together)))
    report["seconds a row alone"] = round(t_alone / len(prepared), 4)
    report["seconds a row batched"] = round(t_batch / max(1, n_b), 4)
    # the API path alone
    api = [decode([p[0][-1]], [{len(p[0][-1]) - 1}])[0][0][0] for p in prepared]
    cmp("one-alone-api vs alone", list(zip(alone, api)))
    # B rows, only the first gives logits
    first_only = []
    for k in range(0, n_b, B):
        sufs = [p[0][-1] for p in prepared[k: k + B]]
        got, _, _ = decode(sufs, [{len(sufs[0]) - 1}] + [set() for _ in sufs[1:]])
        first_only.append((alone[k], got[0][0]))
    cmp("batch-one-output vs alone", first_only)
    # one row alone with its last B tokens giving logits, against the batched row
    b_out = []
    for k in range(n_b):
        suf = prepared[k][0][-1]
        got, _, _ = decode([suf], [set(range(len(suf) - B, len(suf)))])
        b_out.append((together[k], got[0][-1]))
    cmp("alone-B-outputs vs engine batched", b_out)
    b_out_alone = [(alone[k], b_out[k][1]) for k in range(n_b)]
    cmp("alone-B-outputs vs alone", b_out_alone)
    # B copies of one row
    copies, first = [], []
    for k in range(min(4, len(prepared))):
        suf = prepared[k][0][-1]
        got, _, _ = decode([suf] * B, [{len(suf) - 1}] * B)
        copies += [(got[0][0], got[j][0]) for j in range(1, B)]
        first.append((alone[k], got[0][0]))
    cmp("same-row-xB: copy j vs copy 1", copies)
    cmp("same-row-xB: copy 1 vs alone", first)
    # padded: every decode a multiple of 4 tokens with at least P outputs (fillers on their own sequence), so each
    # token meets the same kernels alone and batched (the 4-row repacked gemm, never the gemv tail)
    for P in (4, 8):
        pairs = []
        for k in range(0, n_b, B):
            sufs = [p[0][-1] for p in prepared[k: k + B]]
            got, _, _ = decode(sufs, [{len(s) - 1} for s in sufs], pad=4, pad_outputs=P)
            for j, suf in enumerate(sufs):
                solo, _, _ = decode([suf], [{len(suf) - 1}], pad=4, pad_outputs=P)
                pairs.append((solo[0][0], got[j][0]))
        cmp(f"padded x4 tokens, >= {P} outputs: batched vs alone", pairs)
    # aligned: each row's cells start on a multiple of W cells after the prefix, as alone (fillers between rows)
    for W in (16, 32, 64):
        pairs, sec = [], 0.0
        for k in range(0, n_b, B):
            sufs = [p[0][-1] for p in prepared[k: k + B]]
            got, _, t = decode(sufs, [{len(s) - 1} for s in sufs], align=W)
            sec += t
            pairs += [(alone[k + j], got[j][0]) for j in range(len(sufs))]
        cmp(f"aligned to {W} cells: batched vs alone", pairs)
        report[f"aligned to {W} cells: batched vs alone"]["seconds a row"] = round(sec / max(1, n_b), 4)
    print(json.dumps(report, indent=1), flush=True)


if __name__ == "__main__":
    main()
