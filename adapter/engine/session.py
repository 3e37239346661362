"""One loaded GGUF as a llama.cpp session: the model and its context, tokens, and the KV cache.

What scoring (engine.py) asks of llama.cpp, and nothing about options or probabilities: evaluate a
prompt's segments keeping the leading ones that are already cached (so a cached segment gives the
same bits as a fresh one), fork parallel sequences on a shared prefix, read the logits after a label
on a fork (one token path, or the label trie as one batch), and the hidden state at a prompt's last
token - read from the same decode as its logits (`_HiddenTap`), so asking for it costs no pass. The request's budget (deadline, cancellation) is checked between passes and, through
llama.cpp's abort callback, inside one.
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Callable, Mapping, Protocol

import numpy as np

from adapter.engine import label_trie
from adapter.engine.models import SHIPPED, ModelChoice, Progress, file_sha256, resolve_model
from adapter.engine.prefix_cache import PrefixCache
from adapter.engine.prompt import ChatTemplate, Prompt
from adapter.schema import JSONObject, RequestError

if TYPE_CHECKING:
    import llama_cpp

log = logging.getLogger("semif.engine")


class Budget(Protocol):
    """What a caller passes to stop work early (deadline passed, client gone, shutting down):
    check() raises, and is called between forward passes; should_stop() is asked by llama.cpp's
    abort callback during one, so a long prompt stops within milliseconds too."""

    def check(self) -> None: ...

    def should_stop(self) -> bool: ...


LABEL_CACHE_SIZE = 4096  # (prompt tail, label) -> tokens; bounded so memory does not grow with traffic
# The label trie (label_trie.py): sequence ids beyond the n_parallel ones, one per trie leaf (255
# options like `queue_000` need 26; more leaves take more groups); and the logits rows one of its
# decodes returns. llama.cpp sizes its output buffer for max(rows, sequences) x vocabulary floats for
# the context's life: 64 x 152k x 4 B = 39 MB for Qwen (8 sequences alone took 5 MB).
TRIE_SEQS = 56
TRIE_OUTPUTS = 64
MAX_DEFAULT_CTX = 16384


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class _HiddenTap:
    """The hidden state read from the decode that gives the logits: llama.cpp's graph names the final
    norm's output `result_norm` (what `llama_get_embeddings_ith` returns with embeddings on), and its
    scheduler's eval callback lets a caller look at a named tensor once it is computed. The callback
    only observes: the graph, its kernels and so the logits' bits are those of a decode without it
    (tests/test_head_roundtrip.py). Embeddings on instead would output every token of the batch, which
    changes the last layer's batch shape (logits moved by up to 2.7e-4 on SmolLM2) and pays the output
    matrix for every token. While `rows` is None (no hidden state wanted) the callback observes nothing.
    An architecture whose graph has no `result_norm` leaves `rows` empty: the caller then decodes the
    last token again with embeddings on (`LlamaSession._hidden_at`)."""

    NAME = b"result_norm"

    def __init__(self, n_embd: int) -> None:
        from llama_cpp._ggml import libggml  # llama-cpp-python's handle on libggml (tensor accessors)

        self.n_embd = n_embd
        self.rows: list[np.ndarray] | None = None  # while wanted: result_norm's rows of each decode, in order
        self.failed = False
        self._name = libggml.ggml_get_name
        self._name.argtypes, self._name.restype = [ctypes.c_void_p], ctypes.c_char_p
        self._nelements = libggml.ggml_nelements
        self._nelements.argtypes, self._nelements.restype = [ctypes.c_void_p], ctypes.c_int64
        self._nbytes = libggml.ggml_nbytes
        self._nbytes.argtypes, self._nbytes.restype = [ctypes.c_void_p], ctypes.c_size_t
        self._get = libggml.ggml_backend_tensor_get  # any backend's buffer (CPU, or a GPU's)
        self._get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
        self._get.restype = None

    def __call__(self, tensor: int | None, ask: bool, _data: object) -> bool:
        """llama.cpp's ggml_backend_sched_eval_callback: with `ask`, whether to observe this tensor; else
        the observed tensor is computed (return True to go on). Never raises into C."""
        try:
            if self.rows is None:
                return not ask
            if ask:
                return bool(self._name(tensor) == self.NAME)
            n = int(self._nelements(tensor))
            if n % self.n_embd or int(self._nbytes(tensor)) != 4 * n:  # not float32 rows of n_embd
                self.failed = True
                return True
            out = np.empty((n // self.n_embd, self.n_embd), dtype=np.float32)
            self._get(tensor, out.ctypes.data, 0, 4 * n)
            self.rows.append(out)
        except Exception:  # an exception must not cross into llama.cpp: the caller falls back
            self.failed = True
        return True

    def start(self) -> None:
        self.rows, self.failed = [], False

    def take(self, outputs: int) -> list[np.ndarray] | None:
        """The last decode's hidden states, one per output row of its batch (in batch order), and stop
        observing; None when they were not seen (the caller decodes again)."""
        rows, self.rows = self.rows, None
        if self.failed or not rows or len(rows[-1]) != outputs:
            return None
        return [r.copy() for r in rows[-1]]


@dataclass(frozen=True)
class EngineConfig:
    """Mirrors the DLC's SM_LLAMA_CPP_* style: SM_SEMIF_CTX_SIZE, SM_SEMIF_THREADS, SM_SEMIF_N_GPU_LAYERS,
    SM_SEMIF_BATCH_SIZE, SM_SEMIF_PARALLEL, SM_SEMIF_FLASH_ATTN, SM_SEMIF_ROW_BATCH."""

    n_ctx: int = 0  # 0 = the model's trained context, capped at 16384 (255 /v1/systemone choices fit)
    n_threads: int = 0  # 0 = all CPUs this process may use
    n_gpu_layers: int = 0
    n_batch: int = 512
    n_parallel: int = 8  # question suffixes on one shared prefix evaluated together (1 = one after another)
    # bench.speed, 2 threads: SmolLM2 1.06x faster on 200 prompt tokens, 1.21x on 1,800; Qwen 0.5B 1.02x; 1.5B 1.00x
    flash_attn: bool = True
    # head-layout rows of one policy decoded together as parallel sequences on its cached prefix (1 = one row
    # at a time). Off by default, measured (docs/benchmarks.md, bench.throughput, 2026-12-07): 4 rows gave 1.42x
    # rows/s on Qwen 1.5B (8 rows 1.59x), 1.50x on SmolLM2, on one CPU thread, 1.35x at most on two (~30 tokens a row: most of a row's
    # time is per-token work batching does not remove), and a batched row's bits depend on its companions -
    # llama.cpp's attention over the KV cache the rows share, and on Q4_K weights the repacked and tiled kernels
    # (bench.batch_bits: with all three removed batching is bit-exact and a row costs 2x) - a probability moved by up to
    # 0.045 on Qwen 1.5B and a head's decision changed on some rows (bench.batch_decisions), where one row at a
    # time gives what calibration measured, bit for bit
    row_batch: int = 1

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "EngineConfig":
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
                   max(1, num("SM_SEMIF_PARALLEL", cls.n_parallel)), flag("SM_SEMIF_FLASH_ATTN", cls.flash_attn),
                   max(1, num("SM_SEMIF_ROW_BATCH", cls.row_batch)))


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
    # how the hidden state is read: "decode" (from the decision's own decode, since issue 45) or "re-decode" (a
    # second one-token decode, before). The two differ in the last digits (up to 3.5% of the largest value on the
    # 1.5B model), so a stored hidden state is reused only when it was read the same way (app/core/reuse.py)
    hidden_read: str = "decode"

    def public(self) -> JSONObject:
        """The model as results and /info report it (JSON): every field but the local path."""
        d = asdict(self)
        d.pop("path")
        return d


class LlamaSession:
    """One loaded GGUF and its llama.cpp context. Not thread-safe by itself: `lock` serialises callers."""

    # the hidden state read from the decision's own decode (`_HiddenTap`); False: a second one-token
    # decode reads it (`_hidden_at`), the earlier path that bench.second_decode compares with
    hidden_tap: bool = True

    def __init__(self, model: str | os.PathLike[str] | ModelChoice | None = None, config: EngineConfig | None = None,
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
        self.row_batch = cfg.row_batch
        self._budget: Budget | None = None  # the running call's, read by llama.cpp's abort callback
        self._tap = _HiddenTap(self.llm.n_embd())
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
            hidden_dim=self._n_embd, hidden_read="decode" if self.hidden_tap else "re-decode",
        )
        self.lock = threading.RLock()  # public: callers may hold it across several score() calls
        self.prefixes = PrefixCache(self.info.sha256, f"{self.info.n_ctx}|{cfg.n_batch}|{cfg.n_gpu_layers}|fa{int(cfg.flash_attn)}|"
                                    f"{llama_cpp.__version__}")
        self._cached: list[tuple[int, ...]] = []
        self._cached_logits: np.ndarray | None = None  # last-position logits of exactly `_cached`, if known
        self._cached_hidden: np.ndarray | None = None  # and its last token's hidden state, if it was read
        self._label_cache: OrderedDict[tuple[str, str, bool], tuple[int, ...]] = OrderedDict()
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
        self._eval_cb = llama_cpp_mod.ggml_backend_sched_eval_callback(self._tap)
        params.cb_eval, params.cb_eval_user_data = self._eval_cb, None
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

    def _prefill(self, segs: list[tuple[int, ...]], k: int, budget: Budget | None) -> int:
        """Evaluate segments k.. after the k cached ones (the first one evaluated is also saved to the
        on-disk KV cache); returns the tokens that were already cached."""
        keep = sum(len(s) for s in segs[:k])
        self.llm.n_tokens = keep
        for i in range(k, len(segs)):
            self._eval(list(segs[i]), budget)
            if i == 0:
                self.prefixes.save(self.llm.ctx, segs[0])
        return keep

    def _keep_prefix(self, segs: list[tuple[int, ...]], limit: int) -> int:
        """How many leading segments (at most `limit`) are already in the KV cache."""
        k = 0
        while k < limit and k < len(self._cached) and self._cached[k] == segs[k]:
            k += 1
        return k

    def _forward(self, segs: list[tuple[int, ...]], budget: Budget | None = None, hidden: bool = False
                 ) -> tuple[np.ndarray, int, float]:
        """Evaluate segments, reusing cached leading segments; return last-position logits. The same
        prompt as the last one (a retry, a page run again) is answered from its kept logits: llama.cpp
        is deterministic for a fixed split, so they are the bits an evaluation would give. With
        `hidden`, the last token's hidden state is read from the same decode (`_cached_hidden`; None
        where the model's graph does not show it: `_hidden_at` then)."""
        if (self._cached_logits is not None and self._cached == list(segs)
                and (not hidden or self._cached_hidden is not None or not self.hidden_tap)):
            return self._cached_logits.copy(), sum(len(s) for s in segs), 0.0
        k = self._keep_prefix(segs, len(segs) - 1)
        t0 = time.perf_counter()
        self._cached_logits = self._cached_hidden = None
        if hidden and self.hidden_tap:
            self._tap.start()
        try:
            keep = self._prefill(segs, self._restore_head(segs, k, len(segs) - 1), budget)
        except BaseException:
            self._cached, self.llm.n_tokens = [], 0
            raise
        finally:
            taken = self._tap.take(1)
        self._cached = list(segs)
        ptr = self._llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        logits = np.ctypeslib.as_array(ptr, shape=(self._n_vocab,)).copy()
        self._cached_logits = logits.copy()
        self._cached_hidden = taken[0] if taken else None
        return logits, keep, time.perf_counter() - t0

    def _forward_parallel(self, group: list[list[tuple[int, ...]]], budget: Budget | None, hidden: bool = False
                          ) -> tuple[list[np.ndarray], int, float, list[np.ndarray] | None]:
        """Prompts that share every segment but the last: the shared prefix is evaluated once (or
        kept from the cache) as sequence 0, each last segment becomes its own sequence forked from
        it, and all of them are evaluated in one batch. Returns each prompt's last-position logits,
        the cached prefix tokens, the seconds taken and, with `hidden`, each prompt's last-token
        hidden state from the same batch (None where not seen: `_hidden_at` then). The suffix
        sequences stay in the KV cache (`_extend` reads further label tokens on them) until
        `_drop_suffixes`."""
        cpp = self._llama_cpp
        prefix = group[0][:-1]
        k = self._keep_prefix(prefix, len(prefix))
        n_prefix = sum(len(s) for s in prefix)
        t0 = time.perf_counter()
        mem = cpp.llama_get_memory(self.llm.ctx)
        self._cached_logits = self._cached_hidden = None
        suffixes = [segs[-1] for segs in group]
        batch = cpp.llama_batch_init(sum(len(s) for s in suffixes), 0, 1)
        try:
            keep = self._prefill(prefix, self._restore_head(prefix, k, len(prefix)), budget)
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
            if hidden and self.hidden_tap:
                self._tap.start()
            try:
                self._decode(batch, budget, "a parallel batch")
            finally:
                states = self._tap.take(len(suffixes))
            _count(budget, done=n)
            logits = [np.ctypeslib.as_array(cpp.llama_get_logits_ith(self.llm.ctx, i), shape=(self._n_vocab,)).copy()
                      for i in last]
        except BaseException:
            self._reset_cache()
            raise
        finally:
            cpp.llama_batch_free(batch)
        self._cached, self.llm.n_tokens = list(prefix), n_prefix
        return logits, keep, time.perf_counter() - t0, states

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
        """The fallback where the decision's own decode did not show the hidden state (`_HiddenTap`: a
        graph without `result_norm`, or `hidden_tap` off - the earlier path, kept for bench.second_decode).
        The hidden state (final norm output) at a prompt's last token, which sits on sequence `seq`
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

    def _decode(self, batch: llama_cpp.llama_batch, budget: Budget | None, what: str) -> None:
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
        self._cached, self._cached_logits, self._cached_hidden = [], None, None
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
            self._cached, self._cached_logits, self._cached_hidden = [], None, None
            self.llm.n_tokens = 0
            self.llm._ctx.kv_cache_clear()


def _count(budget: Budget | None, *, planned: int = 0, done: int = 0) -> None:
    """Tell the request's budget how many tokens its work plans and has evaluated, where it keeps
    count (admission.RequestBudget): a request stopped at its deadline then says how far it got."""
    note = getattr(budget, "count_tokens", None)
    if note is not None:
        note(planned=planned, done=done)


def _forecast(budget: Budget | None, tokens: Callable[[], tuple[int, int]]) -> None:
    """Before any work: tell a budget that can refuse early (admission.RequestBudget.forecast) how many
    tokens the work evaluates, and how many of them are the policy's cacheable work (content-free priors
    not kept yet) - counted only when such a budget asks (a refusal before the work, not after)."""
    ahead = getattr(budget, "forecast", None)
    if ahead is not None:
        total, cacheable = tokens()
        if cacheable:
            ahead(total, cacheable=cacheable)
        else:
            ahead(total)


def _after_policy_work(budget: Budget | None) -> None:
    """The policy's cacheable work is done (and kept): a budget that admitted the request only for it refuses now."""
    after = getattr(budget, "after_policy_work", None)
    if after is not None:
        after()


def _quantization(desc: str, meta: dict[str, str]) -> str:
    """'llama 135M Q4_1' -> 'Q4_1'; 'gemma3 270M Q4_K - Medium' -> 'Q4_K_M'."""
    tail = desc.split(" ", 2)[-1] if desc.count(" ") >= 2 else desc
    tail = tail.replace(" - Medium", "_M").replace(" - Small", "_S").replace(" - Large", "_L")
    return tail or meta.get("general.file_type", "unknown")
