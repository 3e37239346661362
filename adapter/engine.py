"""The decision engine: one llama.cpp model, options scored from final-position logits.

Why segments: a prompt is evaluated as a fixed sequence of segments (see prompt.py). Leading
segments that match the previous prompt are kept in the KV cache and not evaluated again, and
because the split of every prompt is always the same, a cached segment gives bit-identical
logits to a fresh evaluation. So the shared-state path (many questions on one state) and the
policy-prefix path (one policy over many states) are exact, not approximations.

`fresh=True` clears the cache first: the reference path.
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time
from datetime import datetime, timezone
from collections import OrderedDict, defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Callable, Iterator, Protocol

import numpy as np

from . import guard, label_trie
from .prefix_cache import PrefixCache
from .models import SHIPPED, ModelChoice, Progress, file_sha256, resolve_model
from .prompt import ChatTemplate, Prompt, render_letters, render_option_words, rotations
from .schema import (Debias, DecisionRequest, DecisionResult, HiddenState, RequestError, SharedStateRequest, finite,
                     state_text)

log = logging.getLogger("semif.engine")


class Budget(Protocol):
    """What a caller passes to stop work early (deadline passed, client gone, shutting down):
    check() raises, and is called between forward passes; should_stop() is asked by llama.cpp's
    abort callback during one, so a long prompt stops within milliseconds too."""

    def check(self) -> None: ...

    def should_stop(self) -> bool: ...


Extend = Callable[[tuple[int, ...]], tuple[np.ndarray, float]]  # label tokens -> (logits after them, seconds)

# "Calibrate Before Use" (Zhao et al. 2021): the answer a prompt gets with no content is its bias.
CONTENT_FREE_STATES = ("N/A", "none", "[MASK]")
PRIOR_CACHE_SIZE = 512
LABEL_CACHE_SIZE = 4096  # (prompt tail, label) -> tokens; bounded so memory does not grow with traffic
# The label trie (label_trie.py): sequence ids beyond the n_parallel ones, one per trie leaf (255
# options like `queue_000` need 26; more leaves take more groups); and the logits rows one of its
# decodes returns. llama.cpp sizes its output buffer for max(rows, sequences) x vocabulary floats for
# the context's life: 64 x 152k x 4 B = 39 MB for Qwen (8 sequences alone took 5 MB).
TRIE_SEQS = 56
TRIE_OUTPUTS = 64
MAX_DEFAULT_CTX = 16384
CHARS_PER_TOKEN_MAX = 16  # no tokenizer packs more on average: longer prompts are refused untokenized


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class EngineConfig:
    """Mirrors the DLC's SM_LLAMA_CPP_* style: SM_SEMIF_CTX_SIZE, SM_SEMIF_THREADS, SM_SEMIF_N_GPU_LAYERS,
    SM_SEMIF_BATCH_SIZE, SM_SEMIF_PARALLEL."""

    n_ctx: int = 0  # 0 = the model's trained context, capped at 16384 (255 /v1/systemone choices fit)
    n_threads: int = 0  # 0 = all CPUs this process may use
    n_gpu_layers: int = 0
    n_batch: int = 512
    n_parallel: int = 8  # question suffixes on one shared prefix evaluated together (1 = one after another)
    # bench.speed, 2 threads: SmolLM2 1.06x faster on 200 prompt tokens, 1.21x on 1,800; Qwen 0.5B 1.02x; 1.5B 1.00x
    flash_attn: bool = True

    @classmethod
    def from_env(cls, env=os.environ) -> "EngineConfig":
        def num(name: str, default: int) -> int:
            raw = env.get(name)
            if raw in (None, ""):
                return default
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not an integer") from None

        def flag(name: str, default: bool) -> bool:
            raw = (env.get(name) or "").strip().lower()
            if raw in ("", "auto"):
                return default
            if raw in ("1", "true", "on", "yes"):
                return True
            if raw in ("0", "false", "off", "no"):
                return False
            raise ValueError(f"{name}={raw!r} is not on/off")

        return cls(num("SM_SEMIF_CTX_SIZE", cls.n_ctx), num("SM_SEMIF_THREADS", cls.n_threads),
                   num("SM_SEMIF_N_GPU_LAYERS", cls.n_gpu_layers), num("SM_SEMIF_BATCH_SIZE", cls.n_batch),
                   max(1, num("SM_SEMIF_PARALLEL", cls.n_parallel)), flag("SM_SEMIF_FLASH_ATTN", cls.flash_attn))


@dataclass(frozen=True)
class ModelInfo:
    file: str
    path: str
    sha256: str
    quantization: str
    description: str
    n_ctx: int
    n_threads: int
    n_gpu_layers: int
    n_parallel: int
    flash_attn: bool
    llama_cpp_version: str
    chat_template: bool
    default_readout: str
    default_debias: str
    source: str
    shipped: str | None
    release_date: str  # the catalog's for a shipped model, else the GGUF file's date
    hidden_dim: int = 0  # length of the hidden state a learned head reads (`hidden_state: true`)

    def public(self) -> dict:
        d = asdict(self)
        d.pop("path")
        return d


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - (m + math.log(np.exp(x - m).sum()))


class Engine:
    """One loaded GGUF. Thread-safe: calls are serialised (a llama.cpp context is not)."""

    generation: int = 0  # set by the workbench's model pool: a reloaded model is a new generation
    # shared label prefixes evaluated as one trie batch (label_trie.py); False: one decode per prefix,
    # the earlier path (kept as the reference bench.options and the tests compare with)
    label_batch: bool = True

    def __init__(self, model: str | os.PathLike | ModelChoice | None = None, config: EngineConfig | None = None,
                 progress: Progress | None = None):
        """`progress(done, total)` reports the one-time assembly of a chunked shipped model."""
        import llama_cpp

        self._llama_cpp = llama_cpp
        choice = model if isinstance(model, ModelChoice) else resolve_model(model, progress)
        cfg = config or EngineConfig()
        threads = cfg.n_threads or default_threads()
        self.llm = llama_cpp.Llama(
            model_path=str(choice.path), n_ctx=cfg.n_ctx or 512, n_batch=cfg.n_batch, n_ubatch=cfg.n_batch,
            n_threads=threads, n_threads_batch=threads, n_gpu_layers=cfg.n_gpu_layers,
            logits_all=False, flash_attn=cfg.flash_attn, verbose=False,
        )
        self.n_parallel = cfg.n_parallel
        self._budget: Budget | None = None  # the running call's, read by llama.cpp's abort callback
        self._use_context(cfg.n_ctx or min(self.llm._model.n_ctx_train(), MAX_DEFAULT_CTX), cfg.n_parallel)
        meta = self.llm.metadata
        lm = self.llm._model
        self._n_vocab = self.llm.n_vocab()
        self._n_embd = self.llm.n_embd()
        self._add_bos = lm.add_bos_token()
        self._bos_text = lm.token_get_text(lm.token_bos()) if lm.token_bos() >= 0 else ""
        template = meta.get("tokenizer.chat_template")
        self.chat = None
        if template:
            eos = lm.token_get_text(lm.token_eos()) if lm.token_eos() >= 0 else ""
            try:
                chat = ChatTemplate(template, bos_token=self._bos_text, eos_token=eos)
            except Exception as exc:  # a template our Jinja sandbox cannot parse: use plain completion prompts
                log.warning("%s: its chat template does not parse (%s); using plain completion prompts",
                            choice.path.name, exc)
                chat = None
            if chat is not None and not chat.works():
                log.warning("%s: its chat template does not render a plain exchange; using plain completion prompts",
                            choice.path.name)
                chat = None
            self.chat = chat
        desc = lm.desc()
        if choice.shipped:
            default_readout, default_debias = SHIPPED[choice.shipped].default_readout, SHIPPED[choice.shipped].default_debias
        else:  # a user's own GGUF: an instruct model reads letters; position bias is corrected by default
            default_readout, default_debias = ("letters", "content-free") if self.chat else ("option-words", "none")
        self.info = ModelInfo(
            file=choice.path.name, path=str(choice.path), sha256=file_sha256(choice.path),
            quantization=_quantization(desc, meta), description=desc, n_ctx=self.llm.n_ctx(),
            n_threads=threads, n_gpu_layers=cfg.n_gpu_layers, n_parallel=cfg.n_parallel, flash_attn=cfg.flash_attn,
            llama_cpp_version=llama_cpp.__version__,
            chat_template=self.chat is not None, default_readout=default_readout, default_debias=default_debias,
            source=choice.source,
            shipped=choice.shipped,
            release_date=(SHIPPED[choice.shipped].release_date if choice.shipped else
                          datetime.fromtimestamp(choice.path.stat().st_mtime, timezone.utc).date().isoformat()),
            hidden_dim=self._n_embd,
        )
        self.lock = threading.RLock()  # public: callers may hold it across several score() calls
        self.prefixes = PrefixCache(self.info.sha256, f"{self.info.n_ctx}|{cfg.n_batch}|{cfg.n_gpu_layers}|fa{int(cfg.flash_attn)}|"
                                    f"{llama_cpp.__version__}")
        self._cached: list[tuple[int, ...]] = []
        self._cached_logits: np.ndarray | None = None  # last-position logits of exactly `_cached`, if known
        self._label_cache: OrderedDict[tuple[str, str, bool], tuple[int, ...]] = OrderedDict()
        self._priors: OrderedDict[str, np.ndarray] = OrderedDict()  # content-free priors, LRU
        self._restore = True  # may a first segment come from the on-disk KV cache (not on the fresh path)

    def _use_context(self, n_ctx: int, n_parallel: int) -> None:
        """Replace the context Llama() made with one that holds `n_parallel` sequences in one unified
        KV buffer: forked question suffixes then share the prefix's cells instead of copying them.
        TRIE_SEQS more sequence ids are for the answer labels' trie (`_forward_labels`): llama_decode
        accepts only ids below the context's n_seq_max."""
        import llama_cpp as llama_cpp_mod
        from llama_cpp import _internals

        params = self.llm.context_params
        params.n_ctx = n_ctx
        params.n_seq_max = min(n_parallel + TRIE_SEQS, llama_cpp_mod.llama_max_parallel_sequences())
        params.kv_unified = True
        self._abort = llama_cpp_mod.ggml_abort_callback(lambda _: self._budget is not None and self._budget.should_stop())
        params.abort_callback, params.abort_callback_data = self._abort, None
        old = self.llm._ctx
        self.llm._ctx = _internals.LlamaContext(model=self.llm._model, params=params, verbose=False)
        self.llm.context_params = params
        old.close()
        self.llm._n_ctx = self.llm.n_ctx()
        if self.llm.input_ids.shape[0] < self.llm._n_ctx:
            self.llm.input_ids = np.zeros(self.llm._n_ctx, dtype=np.intc)

    # -- tokens -----------------------------------------------------------------------------
    def tokenize_prompt(self, prompt: Prompt) -> list[tuple[int, ...]]:
        """Token ids per segment. Only the chat template's own markup may become control tokens:
        every piece of content (state, question, options, examples) is tokenized as plain text."""
        segs = []
        for i, pieces in enumerate(prompt.pieces):
            toks: list[int] = []
            for j, (part, is_text) in enumerate(pieces):
                bos = (i == 0 and j == 0 and self._add_bos
                       and not (not is_text and self._bos_text and part.startswith(self._bos_text)))
                toks += self.llm.tokenize(part.encode(), add_bos=bos, special=not is_text)
            segs.append(tuple(toks))
        return segs

    def label_tokens(self, prompt: Prompt) -> list[tuple[int, ...]]:
        """Token ids of each answer label as they follow this prompt's last characters. The tail is
        the prompt's last piece: template markup (letters after an assistant header) is tokenized as
        markup, plain text (option-words) as text - and so is the label, an option id a user chose:
        an id like `<|im_end|>` is read as those characters, never as the control token."""
        last_text, is_text = prompt.pieces[-1][-1] if prompt.pieces[-1] else ("", True)
        return [self._label_seq(last_text[-48:], lab, markup=not is_text) for lab in prompt.labels]

    def _label_seq(self, tail: str, label: str, markup: bool = False) -> tuple[int, ...]:
        key = (tail, label, markup)
        if key in self._label_cache:
            self._label_cache.move_to_end(key)
        else:
            base = self.llm.tokenize(tail.encode(), add_bos=False, special=markup)
            full = self.llm.tokenize((tail + label).encode(), add_bos=False, special=markup)
            plain = tuple(self.llm.tokenize(label.encode(), add_bos=False, special=False))
            if markup and tuple(self.llm.tokenize(label.encode(), add_bos=False, special=True)) != plain:
                seq = plain  # a label with control-token text after markup: its characters, on their own
            elif full[: len(base)] == base and len(full) > len(base):
                seq = tuple(full[len(base):])
            else:  # the label merged with the prompt's last token: read it on its own
                seq = plain
            self._label_cache[key] = seq
            while len(self._label_cache) > LABEL_CACHE_SIZE:
                self._label_cache.popitem(last=False)
        return self._label_cache[key]

    # -- forward ----------------------------------------------------------------------------
    def _eval(self, tokens: list[int], budget: Budget | None) -> None:
        """llm.eval in n_batch chunks - exactly the split llm.eval makes itself, so results are the
        same - checking the request's budget (deadline, cancellation) between chunks."""
        for i in range(0, len(tokens), self.llm.n_batch):
            if budget is not None:
                budget.check()
            try:
                self.llm.eval(tokens[i: i + self.llm.n_batch])
            except RuntimeError:
                if budget is not None:
                    budget.check()  # aborted by the callback: raise the budget's own reason
                raise
            _count(budget, done=len(tokens[i: i + self.llm.n_batch]))

    def _keep_prefix(self, segs: list[tuple[int, ...]], limit: int) -> int:
        """How many leading segments (at most `limit`) are already in the KV cache."""
        k = 0
        while k < limit and k < len(self._cached) and self._cached[k] == segs[k]:
            k += 1
        return k

    def _forward(self, segs: list[tuple[int, ...]], budget: Budget | None = None) -> tuple[np.ndarray, int, float]:
        """Evaluate segments, reusing cached leading segments; return last-position logits. The same
        prompt as the last one (a retry, a page run again) is answered from its kept logits: llama.cpp
        is deterministic for a fixed split, so they are the bits an evaluation would give."""
        if self._cached_logits is not None and self._cached == list(segs):
            return self._cached_logits.copy(), sum(len(s) for s in segs), 0.0
        k = self._keep_prefix(segs, len(segs) - 1)
        t0 = time.perf_counter()
        self._cached_logits = None
        try:
            k = self._restore_head(segs, k, len(segs) - 1)
            keep = sum(len(s) for s in segs[:k])
            self.llm.n_tokens = keep
            for i in range(k, len(segs)):
                self._eval(list(segs[i]), budget)
                if i == 0:
                    self.prefixes.save(self.llm.ctx, segs[0])
        except BaseException:
            self._cached, self.llm.n_tokens = [], 0
            raise
        self._cached = list(segs)
        ptr = self._llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        logits = np.ctypeslib.as_array(ptr, shape=(self._n_vocab,)).copy()
        self._cached_logits = logits.copy()
        return logits, keep, time.perf_counter() - t0

    def _forward_parallel(self, group: list[list[tuple[int, ...]]], budget: Budget | None
                          ) -> tuple[list[np.ndarray], int, float]:
        """Prompts that share every segment but the last: the shared prefix is evaluated once (or
        kept from the cache) as sequence 0, each last segment becomes its own sequence forked from
        it, and all of them are evaluated in one batch. Returns each prompt's last-position logits,
        the cached prefix tokens and the seconds taken. The suffix sequences stay in the KV cache
        (`_extend` reads further label tokens on them) until `_drop_suffixes`."""
        cpp = self._llama_cpp
        prefix = group[0][:-1]
        k = self._keep_prefix(prefix, len(prefix))
        n_prefix = sum(len(s) for s in prefix)
        t0 = time.perf_counter()
        mem = cpp.llama_get_memory(self.llm.ctx)
        self._cached_logits = None
        suffixes = [segs[-1] for segs in group]
        batch = cpp.llama_batch_init(sum(len(s) for s in suffixes), 0, 1)
        try:
            k = self._restore_head(prefix, k, len(prefix))
            keep = sum(len(s) for s in prefix[:k])
            self.llm.n_tokens = keep
            for i in range(k, len(prefix)):
                self._eval(list(prefix[i]), budget)
                if i == 0:
                    self.prefixes.save(self.llm.ctx, prefix[0])
            self.llm._ctx.kv_cache_seq_rm(-1, n_prefix, -1)  # what earlier suffixes left behind
            last, n = [], 0
            for j, suffix in enumerate(suffixes, 1):
                cpp.llama_memory_seq_cp(mem, 0, j, -1, -1)
                for i, tok in enumerate(suffix):
                    batch.token[n], batch.pos[n], batch.n_seq_id[n] = tok, n_prefix + i, 1
                    batch.seq_id[n][0] = j
                    batch.logits[n] = i == len(suffix) - 1
                    n += 1
                last.append(n - 1)
            batch.n_tokens = n
            self._decode(batch, budget, "a parallel batch")
            _count(budget, done=n)
            logits = [np.ctypeslib.as_array(cpp.llama_get_logits_ith(self.llm.ctx, i), shape=(self._n_vocab,)).copy()
                      for i in last]
        except BaseException:
            self._reset_cache()
            raise
        finally:
            cpp.llama_batch_free(batch)
        self._cached, self.llm.n_tokens = list(prefix), n_prefix
        return logits, keep, time.perf_counter() - t0

    def _extend(self, seq: int, at: int, path: tuple[int, ...], budget: Budget | None) -> tuple[np.ndarray, float]:
        """Logits after `path` on a suffix sequence still in the cache (its prompt ends at position
        `at`): options that share a first token are told apart for the cost of the label tokens,
        not of the whole suffix again. The path's cells are removed again before returning."""
        cpp = self._llama_cpp
        t0 = time.perf_counter()
        batch = cpp.llama_batch_init(len(path), 0, 1)
        try:
            for i, tok in enumerate(path):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, at + i, 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = i == len(path) - 1
            batch.n_tokens = len(path)
            self._decode(batch, budget, "a label on a parallel sequence")
            _count(budget, done=len(path))
            logits = np.ctypeslib.as_array(cpp.llama_get_logits_ith(self.llm.ctx, len(path) - 1),
                                           shape=(self._n_vocab,)).copy()
        except BaseException:
            self._reset_cache()
            raise
        finally:
            cpp.llama_batch_free(batch)
        cpp.llama_memory_seq_rm(cpp.llama_get_memory(self.llm.ctx), seq, at, -1)
        return logits, time.perf_counter() - t0

    def _hidden_at(self, seq: int, pos: int, token: int, budget: Budget | None) -> np.ndarray:
        """The hidden state (final norm output) at a prompt's last token, which sits on sequence `seq`
        at position `pos`: that one cell is removed and the token decoded again, alone, with llama.cpp's
        embeddings output on. The prompt's decision logits were read before and are not touched (with
        embeddings on, llama.cpp outputs every token of a batch, which would change how the decision's
        batch is computed); one token costs a few tens of milliseconds, not a second pass over the
        prompt, and the same cache gives the same bits every time. The cell it leaves is not the
        decision pass's bit for bit: callers drop it from what the cache claims to hold."""
        cpp = self._llama_cpp
        if budget is not None:
            budget.check()
        cpp.llama_memory_seq_rm(cpp.llama_get_memory(self.llm.ctx), seq, pos, -1)
        batch = cpp.llama_batch_init(1, 0, 1)
        try:
            batch.token[0], batch.pos[0], batch.n_seq_id[0] = token, pos, 1
            batch.seq_id[0][0] = seq
            batch.logits[0] = True
            batch.n_tokens = 1
            cpp.llama_set_embeddings(self.llm.ctx, True)
            try:
                self._decode(batch, budget, "a prompt's last token for its hidden state")
            finally:
                cpp.llama_set_embeddings(self.llm.ctx, False)
            ptr = cpp.llama_get_embeddings_ith(self.llm.ctx, 0)
            if not ptr:
                raise RequestError(["hidden_state"], "this model gives no per-token hidden state (a pooled embedding "
                                   "model): a learned head cannot read it - use a generative GGUF")
            return np.ctypeslib.as_array(ptr, shape=(self._n_embd,)).astype(np.float32).copy()
        except BaseException:
            self._reset_cache()
            raise
        finally:
            cpp.llama_batch_free(batch)

    def _forward_labels(self, seqs: list[tuple[int, ...]], src: int, at: int, free: int, budget: Budget | None
                        ) -> tuple[dict[tuple[int, ...], np.ndarray], int, float]:
        """The logits after every label prefix two or more options share, for a prompt that is
        sequence `src` of the cache and ends at position `at`, with `free` KV cells unused: the
        label trie as one batch (label_trie.py) - one llama_decode for a few hundred options where
        the per-prefix path made one per shared prefix. Sequence ids from `n_parallel` up are free
        (1 .. n_parallel-1 may hold a parallel batch's suffixes); the forks are removed again, so
        the cache holds what it held before. Returns (logits by prefix, decodes, seconds)."""
        cpp = self._llama_cpp
        t0 = time.perf_counter()
        first = self.n_parallel
        groups = label_trie.plan(seqs, max_slots=cpp.llama_n_seq_max(self.llm.ctx) - first, max_cells=free,
                                 max_tokens=self.llm.n_batch, max_outputs=TRIE_OUTPUTS)
        mem = cpp.llama_get_memory(self.llm.ctx)
        out: dict[tuple[int, ...], np.ndarray] = {}
        decodes = 0
        for group in groups:
            try:
                for s in range(group.n_slots):
                    cpp.llama_memory_seq_cp(mem, src, first + s, -1, -1)
                for step in group.steps:
                    batch = cpp.llama_batch_init(len(step), 0, max(len(t.slots) for t in step))
                    try:
                        for i, t in enumerate(step):
                            batch.token[i], batch.pos[i], batch.n_seq_id[i] = t.token, at + t.depth, len(t.slots)
                            for k, s in enumerate(t.slots):
                                batch.seq_id[i][k] = first + s
                            batch.logits[i] = t.output
                        batch.n_tokens = len(step)
                        self._decode(batch, budget, "the answer labels' shared prefixes")
                        decodes += 1
                        _count(budget, done=len(step))
                        for i, t in enumerate(step):
                            if t.output:
                                out[t.path] = np.ctypeslib.as_array(cpp.llama_get_logits_ith(self.llm.ctx, i),
                                                                    shape=(self._n_vocab,)).copy()
                    finally:
                        cpp.llama_batch_free(batch)
            except BaseException:
                self._reset_cache()
                raise
            for s in range(group.n_slots):
                cpp.llama_memory_seq_rm(mem, first + s, -1, -1)
        return out, decodes, time.perf_counter() - t0

    def _decode(self, batch, budget: Budget | None, what: str) -> None:
        """llama_decode with the request's budget checked before, and after an abort by the callback
        (so the budget's own reason is raised, not a decode failure)."""
        if budget is not None:
            budget.check()
        if self._llama_cpp.llama_decode(self.llm.ctx, batch) != 0:
            if budget is not None:
                budget.check()
            raise RuntimeError(f"llama_decode failed on {what} (context full?)")

    def _drop_suffixes(self, n: int) -> None:
        """Remove the suffix sequences 1..n a parallel batch left in the cache (the prefix stays)."""
        mem = self._llama_cpp.llama_get_memory(self.llm.ctx)
        for j in range(1, n + 1):
            self._llama_cpp.llama_memory_seq_rm(mem, j, -1, -1)

    def _reset_cache(self) -> None:
        self._cached, self._cached_logits = [], None
        self.llm._ctx.kv_cache_clear()
        self.llm.n_tokens = 0

    def _restore_head(self, segs: list[tuple[int, ...]], k: int, limit: int) -> int:
        """With nothing reusable in memory, load the first segment's KV from disk when it was saved
        before (a restarted process skips evaluating it); returns the segments now in the cache."""
        if k == 0 and limit > 0:
            self.llm._ctx.kv_cache_clear()
            if self._restore and self.prefixes.load(self.llm.ctx, segs[0]):
                return 1
        return k

    def clear_cache(self) -> None:
        with self.lock:
            self._cached, self._cached_logits = [], None
            self.llm.n_tokens = 0
            self.llm._ctx.kv_cache_clear()

    # -- scoring ----------------------------------------------------------------------------
    def render(self, req: DecisionRequest, readout: str, order: list[int] | None = None) -> Prompt:
        """The row's prompt. Examples are shown when `few_shot` says so, else by readout (option-words
        shows them, letters does not - the measured defaults, kept so old prompts stay the same)."""
        shown = req.examples if (req.few_shot if req.few_shot is not None else readout == "option-words") else []
        if readout == "letters":
            return render_letters(req.state, req.question, req.options, self.chat, order, shown)
        return render_option_words(req.state, req.question, req.options, shown, order)

    def _prepare(self, prompt: Prompt) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
        """(prompt segments, answer-label token sequences) as token ids, checked before any work."""
        chars = sum(len(t) for t in prompt.segments)
        if chars > CHARS_PER_TOKEN_MAX * self.info.n_ctx:  # cannot fit: refuse before tokenizing megabytes
            raise RequestError(["state"], f"the prompt is {chars} characters, far more than the {self.info.n_ctx}-token "
                               "context holds: shorten the state/examples", "value_error.too_long")
        segs = self.tokenize_prompt(prompt)
        seqs = self.label_tokens(prompt)
        if prompt.readout == "letters":
            for lab, seq in zip(prompt.labels, seqs):
                if len(seq) != 1:
                    raise RequestError(["readout"], f"letter {lab.strip()!r} is {len(seq)} tokens for this model, "
                                       "so it cannot be read from one position: use readout 'option-words'")
        for a, sa in enumerate(seqs):
            for b, sb in enumerate(seqs):
                if a != b and sb[: len(sa)] == sa:
                    raise RequestError(["options"], f"options {prompt.labels[a].strip()!r} and {prompt.labels[b].strip()!r} "
                                       "read as the same tokens for this model: make their ids differ")
        n_in = sum(len(s) for s in segs)
        depth = max(len(s) for s in seqs)
        if n_in + depth > self.info.n_ctx:
            raise RequestError(["state"], f"the prompt is {n_in} tokens but the context holds {self.info.n_ctx}: "
                               "shorten the state/examples or raise SM_SEMIF_CTX_SIZE", "value_error.too_long")
        return segs, seqs

    def evaluate(self, prompts: list[Prompt], budget: Budget | None = None,
                 hidden: frozenset[int] = frozenset()) -> list[dict]:
        """Score prompts in order. Consecutive prompts that differ only in their last segment (several
        questions on one state, the option orders of a permutation) are evaluated as parallel
        sequences on their shared prefix, up to `n_parallel` at a time. The prompts at the indices in
        `hidden` also return their last token's hidden state (`_hidden_at`), read after their options."""
        unique: dict[tuple, int] = {}  # the same prompt twice in one call is evaluated once
        firsts = [unique.setdefault((tuple(p.segments), tuple(p.labels), p.version), i) for i, p in enumerate(prompts)]
        if len(unique) < len(prompts):
            keep = list(unique.values())
            wanted = frozenset(keep.index(firsts[i]) for i in hidden)
            distinct = self.evaluate([prompts[i] for i in keep], budget, wanted)
            by_first = dict(zip(unique.values(), distinct))
            return [dict(by_first[f]) for f in firsts]
        prepared = [self._prepare(p) for p in prompts]
        _count(budget, planned=self._planned(prepared))
        out: list[dict] = []
        i = 0
        while i < len(prepared):
            j = i + 1
            head = prepared[i][0][:-1]
            if head:
                n_head = sum(len(s) for s in head)
                # one batch of suffixes, all of them beside the prefix in the (unified) KV cache, with
                # room for the longest answer label read after one of them (`_extend`)
                while (j < len(prepared) and j - i < self.n_parallel - 1 and prepared[j][0][:-1] == head
                       and (n_suffixes := sum(len(p[0][-1]) for p in prepared[i: j + 1])) <= self.llm.n_batch
                       and n_head + n_suffixes + max(len(t) for p in prepared[i: j + 1] for t in p[1])
                       <= self.llm.n_ctx()):
                    j += 1
            if j - i > 1:
                logits, cached, seconds = self._forward_parallel([p[0] for p in prepared[i:j]], budget)
                free = self.llm.n_ctx() - n_head - sum(len(p[0][-1]) for p in prepared[i:j])
                try:
                    for k in range(i, j):  # the first pays for the prefix; the others reuse it
                        end = n_head + len(prepared[k][0][-1])
                        extend = (lambda path, seq=k - i + 1, at=end: self._extend(seq, at, path, budget))
                        out.append(self._finish(prompts[k], *prepared[k], logits[k - i], cached if k == i else n_head,
                                                seconds / (j - i), budget, extend, fork=(k - i + 1, end, free)))
                        if k in hidden:
                            out[-1]["hidden"] = self._hidden_at(k - i + 1, end - 1, prepared[k][0][-1][-1], budget)
                finally:
                    self._drop_suffixes(j - i)
            else:
                logits1, cached1, seconds1 = self._forward(prepared[i][0], budget)
                n_in = sum(len(s) for s in prepared[i][0])
                out.append(self._finish(prompts[i], *prepared[i], logits1, cached1, seconds1, budget,
                                        fork=(0, n_in, self.llm.n_ctx() - n_in)))
                if i in hidden:
                    segs = prepared[i][0]
                    out[-1]["hidden"] = self._hidden_at(0, n_in - 1, segs[-1][-1], budget)
                    # the last segment's cells are no longer the decision pass's: keep only what is
                    self._cached, self._cached_logits = list(segs[:-1]), None
                    self.llm.n_tokens = sum(len(s) for s in segs[:-1])
            i = j
        return out

    def _planned(self, prepared: list[tuple[list[tuple[int, ...]], list[tuple[int, ...]]]]) -> int:
        """About how many tokens `evaluate` will have llama.cpp evaluate for these prompts: segments
        not in the cache (a prefix shared by several prompts once) plus their shared label prefixes.
        Only for the deadline's message: how far a request got of what it asked for."""
        seen: set[tuple] = set()
        total = 0
        for segs, seqs in prepared:
            for k in range(len(segs)):
                head = tuple(segs[: k + 1])
                if head not in seen and self._cached[: k + 1] != list(head):
                    total += len(segs[k])
                seen.add(head)
            total += len(label_trie.inner_paths(seqs))
        return total

    def _finish(self, prompt: Prompt, segs, seqs, logits: np.ndarray, cached: int, seconds: float,
                budget: Budget | None, extend: Extend | None = None,
                fork: tuple[int, int, int] | None = None) -> dict:
        """A prompt's result from its last-position logits; options sharing label tokens are told
        apart by `_walk`. With `fork` = (the prompt's sequence, its end position, free KV cells) and
        `label_batch` on, every shared prefix is evaluated first, as one trie batch
        (`_forward_labels`), and the walk reads those logits; `extra_evals` then counts decodes."""
        stats = {"forward_seconds": seconds, "extra_evals": 0}
        scores = np.zeros(len(seqs))
        batched = (fork is not None and self.label_batch and len({s[0] for s in seqs}) < len(seqs)
                   and self._llama_cpp.llama_n_seq_max(self.llm.ctx) > self.n_parallel)
        if batched:
            assert fork is not None
            table, decodes, sec = self._forward_labels(seqs, *fork, budget)
            extend = (lambda path: (table[path], 0.0))
        self._walk(segs, seqs, list(range(len(seqs))), 0, logits, (), scores, stats, budget, extend)
        if batched:
            stats["forward_seconds"] += sec
            stats["extra_evals"] = decodes
        logp = _log_softmax(logits)
        first = sorted({s[0] for s in seqs})
        label_mass = float(np.exp(logp[first]).sum())
        disp = np.exp(scores - scores.max())
        disp /= disp.sum()
        n = len(seqs)
        probs, raw = np.zeros(n), np.zeros(n)
        for k, idx in enumerate(prompt.order):
            probs[idx], raw[idx] = disp[k], scores[k]
        return {"probs": probs, "logits": raw, "label_mass": label_mass, "input_tokens": sum(len(s) for s in segs),
                "cached_tokens": cached, "label_token_counts": [len(s) for s in seqs],
                "forward_seconds": stats["forward_seconds"], "extra_evals": stats["extra_evals"],
                "sha": prompt.sha256(), "version": prompt.version}

    def _walk(self, segs, seqs, members, depth, logits, prefix, scores, stats, budget=None,
              extend: Extend | None = None) -> None:
        """Score options by their label tokens; options sharing a first token are told apart by
        evaluating that token and reading the next one (log-probabilities added to the raw logit).
        `extend` evaluates the shared tokens on the prompt's own sequence of a parallel batch;
        without it the prompt is the cached one and only the shared tokens are evaluated too."""
        base = logits.astype(np.float64) if depth == 0 else _log_softmax(logits)
        groups: dict[int, list[int]] = defaultdict(list)
        for i in members:
            if depth >= len(seqs[i]):
                raise RequestError(["options"], "two options have the same tokens for this model: make their ids differ")
            groups[seqs[i][depth]].append(i)
        for tok, group in groups.items():
            scores[group] += base[tok]
            if len(group) > 1:
                path = (*prefix, tok)
                if extend is not None:
                    sub, sec = extend(path)
                else:
                    sub, _, sec = self._forward([*segs, path], budget)
                stats["forward_seconds"] += sec
                stats["extra_evals"] += 1
                self._walk(segs, seqs, group, depth + 1, sub, path, scores, stats, budget, extend)

    def settings(self, req: DecisionRequest) -> tuple[str, Debias]:
        """(readout, debias) for a row: its own, else the model's measured defaults."""
        return resolve_settings(req.readout, req.debias, self.info.default_readout, self.info.default_debias)

    def prior(self, req: DecisionRequest, readout: str, order: list[int] | None,
              budget: Budget | None = None) -> np.ndarray:
        """The policy's content-free prior for one option order, in request order: the mean
        probabilities the prompt gives with no state (CONTENT_FREE_STATES). Cached per policy x
        readout x order, so it costs len(CONTENT_FREE_STATES) passes per policy, not per row."""
        key = self.render(req.model_copy(update={"state": "\x00"}), readout, order).sha256()
        if key in self._priors:
            self._priors.move_to_end(key)
            return self._priors[key]
        runs = self.evaluate([self.render(req.model_copy(update={"state": s}), readout, order)
                              for s in CONTENT_FREE_STATES], budget)
        prior = np.mean([r["probs"] for r in runs], axis=0)
        self._priors[key] = prior
        while len(self._priors) > PRIOR_CACHE_SIZE:
            self._priors.popitem(last=False)
        return prior

    def score(self, req: DecisionRequest, *, fresh: bool = False, budget: Budget | None = None) -> DecisionResult:
        """Score one row. Same input -> same output, bit for bit, cached or fresh."""
        return self.score_many([req], fresh=fresh, budget=budget)[0]

    def score_many(self, rows: list[DecisionRequest], *, fresh: bool = False, budget: Budget | None = None,
                   together: bool = False, guard_when: Callable[[int, DecisionResult], bool] | None = None
                   ) -> list[DecisionResult]:
        """Score rows in order, as one unit of work: content-free priors first (so that rows sharing a
        state still find it in the KV cache), then the rows. A row's own prompts (the option orders
        of a permutation) are always evaluated together where they share a prefix. With `together`
        (several questions on one state: /v1/systemone, shared-state requests) prompts of different
        rows are too - faster, but a row's last bits then depend on its companions; without it each
        row gives exactly what it gives alone (what calibration measured).
        `budget.check()` is called between forward passes and raises to stop early.
        Rows that ask for a steering guard get it after all rows are scored (so the guard's passes
        never change a row's bits), unless `guard_when(i, result)` says no (the adapter skips rows
        its calibrated policy gates anyway)."""
        with self.lock:
            if fresh:  # the reference path: nothing from memory or disk
                self.clear_cache()
                self._priors.clear()
            self._restore, self._budget = not fresh, budget
            try:
                results = self._score_many(rows, budget, together)
                for i, (req, res) in enumerate(zip(rows, results)):
                    if req.guard and req.guard != "none":
                        with _row(i):
                            run = guard_when is None or guard_when(i, res)
                            res.guard = self.guard_check(req, res, budget) if run else skipped_guard(req.guard)
                return results
            finally:
                self._restore, self._budget = True, None

    def _score_many(self, rows: list[DecisionRequest], budget: Budget | None, together: bool) -> list[DecisionResult]:
        t0 = time.perf_counter()
        settings, rendered = [], []
        for i, req in enumerate(rows):  # every row checked before any work, errors naming their row
            try:
                readout, debias = self.settings(req)
                orders = rotations(len(req.options)) if req.permute else [None]
                row_prompts = [self.render(req, readout, order) for order in orders]
                self._prepare(row_prompts[0])
            except RequestError as exc:
                exc.row = i
                raise
            settings.append((readout, debias, orders))
            rendered.append(row_prompts)
        plans: list[tuple] = []
        prompts: list[Prompt] = []
        for i, (req, (readout, debias, orders), row_prompts) in enumerate(zip(rows, settings, rendered)):
            with _row(i):
                priors = [self.prior(req, readout, o, budget) for o in orders] if debias == "content-free" else None
            plans.append((req, readout, debias, len(prompts), len(orders), priors))
            prompts += row_prompts
        if together:
            # a canonical order: prompts that share a prefix sit together, and the batches (so the
            # bits) do not depend on the order in which a request listed its questions
            canon = sorted(range(len(prompts)), key=lambda i: (prompts[i].segments[:-1], prompts[i].segments[-1],
                                                               prompts[i].labels))
            firsts = {at for req, _, _, at, _, _ in plans if req.hidden_state}  # a row's request-order prompt
            runs: list[dict] = [{} for _ in prompts]
            wanted = frozenset(pos for pos, i in enumerate(canon) if i in firsts)
            for i, r in zip(canon, self.evaluate([prompts[i] for i in canon], budget, wanted)):
                runs[i] = r
        else:
            runs = []
            for i, (req, _, _, at, n, _) in enumerate(plans):
                with _row(i):
                    runs += self.evaluate(prompts[at: at + n], budget, frozenset({0}) if req.hidden_state else frozenset())
        seconds = (time.perf_counter() - t0) / max(1, len(rows))
        return [self._result(req, readout, debias, runs[at: at + n], priors, seconds)
                for req, readout, debias, at, n, priors in plans]

    def _result(self, req: DecisionRequest, readout: str, debias: Debias, runs: list[dict], priors: list | None,
                seconds: float) -> DecisionResult:
        raw_probs = [r["probs"] for r in runs]
        probs, logits = _combine(runs, priors)
        top = int(np.argmax(probs))
        return DecisionResult(
            id=req.id,
            option_ids=[o.id for o in req.options],
            probabilities=[finite(float(p)) for p in probs],
            option_logits=[finite(float(x)) for x in logits],
            top_option=req.options[top].id,
            label_mass=finite(float(np.mean([r["label_mass"] for r in runs]))),
            readout=readout,
            debias=debias,
            prompt_version=runs[0]["version"],
            prompt_sha256=runs[0]["sha"],
            permutations=len(runs),
            input_tokens=runs[0]["input_tokens"],
            cached_tokens=sum(r["cached_tokens"] for r in runs),
            evaluated_tokens=sum(r["input_tokens"] - r["cached_tokens"] for r in runs),
            label_token_counts=runs[0]["label_token_counts"],
            extra_evals=sum(r["extra_evals"] for r in runs),
            forward_seconds=sum(r["forward_seconds"] for r in runs),
            total_seconds=seconds,  # this row's share of the call (rows evaluated together share time)
            model=self.info.public(),
            prior=None if priors is None else [finite(float(p)) for p in np.mean(priors, axis=0)],
            hidden_state=HiddenState.of(runs[0]["hidden"]) if req.hidden_state and "hidden" in runs[0] else None,
            uncorrected_probabilities=None if priors is None else [finite(float(p)) for p in np.mean(raw_probs, axis=0)],
        )

    def guard_check(self, req: DecisionRequest, result: DecisionResult, budget: Budget | None = None, *,
                    use_precheck: bool = True, exhaustive: bool = False) -> dict:
        """The steering guard for one scored row (guard.py): the precheck, then - for
        erase-and-check - the state scored with pieces left out, with the row's own readout,
        correction and option orders. A variant disagrees when its own top option leads the row's
        answer by at least `guard.MIN_MARGIN` in the variant: removing the piece gave a clear other
        answer (removing the only evidence leaves a flat answer, and that is no sign of steering).
        Variants are rendered with everything after the first segment joined, so they share the
        cached instruction and are evaluated as parallel sequences, a batch at a time; the first
        disagreement stops the check. `use_precheck=False` / `exhaustive=True` measure
        erase-and-check on its own over every variant (bench.guard)."""
        t0 = time.perf_counter()
        pieces = guard.split_state(req.state)
        found = guard.precheck(req.state if isinstance(req.state, str) else state_text(req.state),
                               req.options) if use_precheck else None
        out: dict = {"method": req.guard, "suspected": False, "piece": None, "removed": None, "passes": 0,
                     "pieces": len(pieces), "precheck": found}
        if found is not None:
            out.update(suspected=True, by="precheck", piece=guard.piece_at(pieces, found["at"]) if isinstance(
                req.state, str) else None)
        if out["suspected"] or req.guard != "erase-and-check":
            out["seconds"] = round(time.perf_counter() - t0, 4)
            return out
        readout, debias = result.readout, result.debias or "none"
        orders = rotations(len(req.options)) if req.permute else [None]
        priors = [self.prior(req, readout, o, budget) for o in orders] if debias == "content-free" else None
        answer = result.option_ids.index(result.top_option)
        spans = guard.erasures(len(pieces))
        per_batch = max(1, (self.n_parallel - 1) // len(orders))
        seen: list[dict] = []
        for at in range(0, len(spans), per_batch):
            batch = spans[at: at + per_batch]
            variants = [req.model_copy(update={"state": pieces.without(*span)}) for span in batch]
            prompts = [self.render(v, readout, o).merged() for v in variants for o in orders]
            runs = self.evaluate(prompts, budget)
            out["passes"] += len(prompts)
            for k, span in enumerate(batch):
                probs, _ = _combine(runs[k * len(orders): (k + 1) * len(orders)], priors)
                top = int(np.argmax(probs))
                lead = float(probs[top] - probs[answer])
                seen.append({"removed": list(span), "top": req.options[top].id, "lead": round(lead, 4)})
                if not out["suspected"] and lead >= guard.MIN_MARGIN:
                    out.update(suspected=True, by="erase-and-check", piece=span[0], removed=list(span),
                               variant_top=req.options[top].id, lead=round(lead, 4))
            if out["suspected"] and not exhaustive:
                break
        if exhaustive:
            out["variants"] = seen
        out["seconds"] = round(time.perf_counter() - t0, 4)
        return out

    def score_shared(self, shared: SharedStateRequest, budget: Budget | None = None) -> list[DecisionResult]:
        """Many questions on one state: the state segment is evaluated once, the questions together."""
        return self.score_many(shared.rows(), budget=budget, together=True)


def resolve_settings(readout: str | None, debias: str | None, default_readout: str,
                     default_debias: str) -> tuple[str, Debias]:
    """(readout, debias) a row is read with: its own, else the model's measured defaults. The default
    debias belongs to the default readout; another readout asked for by name gets none. Pure, so the
    workbench can tell which stored results a request would reproduce (app/core/reuse.py)."""
    chosen = readout or default_readout
    if debias:
        return chosen, "content-free" if debias == "content-free" else "none"
    default: Debias = "content-free" if default_debias == "content-free" else "none"
    return chosen, (default if chosen == default_readout else "none")


def _combine(runs: list[dict], priors: list | None) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities, logits) of one row from its option orders' runs: the content-free prior
    divided out and renormalised per order; several orders (permutation) averaged, the logits
    then reported as the log of the mean."""
    raw_probs = [r["probs"] for r in runs]
    if priors is not None:
        fixed = [p / np.maximum(q, 1e-12) for p, q in zip(raw_probs, priors)]
        probs_per_order = [f / f.sum() for f in fixed]
    else:
        probs_per_order = raw_probs
    if len(runs) == 1:
        logits = runs[0]["logits"] - (np.log(np.maximum(priors[0], 1e-12)) if priors is not None else 0.0)
        return probs_per_order[0], logits
    probs = np.mean(probs_per_order, axis=0)
    return probs, np.log(np.maximum(probs, 1e-300))


def skipped_guard(method: str) -> dict:
    """The guard's entry for a row it did not check (its calibrated policy gates it anyway)."""
    return {"method": method, "suspected": False, "piece": None, "removed": None, "passes": 0, "skipped": "gated"}


def _count(budget: Budget | None, *, planned: int = 0, done: int = 0) -> None:
    """Tell the request's budget how many tokens its work plans and has evaluated, where it keeps
    count (admission.RequestBudget): a request stopped at its deadline then says how far it got."""
    note = getattr(budget, "count_tokens", None)
    if note is not None:
        note(planned=planned, done=done)


@contextmanager
def _row(i: int) -> Iterator[None]:
    """A RequestError raised while scoring row i names that row (the server then names its loc)."""
    try:
        yield
    except RequestError as exc:
        if exc.row is None:
            exc.row = i
        raise


def _quantization(desc: str, meta: dict) -> str:
    """'llama 135M Q4_1' -> 'Q4_1'; 'gemma3 270M Q4_K - Medium' -> 'Q4_K_M'."""
    tail = desc.split(" ", 2)[-1] if desc.count(" ") >= 2 else desc
    tail = tail.replace(" - Medium", "_M").replace(" - Small", "_S").replace(" - Large", "_L")
    return tail or meta.get("general.file_type", "unknown")
