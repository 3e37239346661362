"""The decision engine: options scored from final-position logits of one llama.cpp session
(session.py: the model, its tokens and KV cache; guard_check.py: the steering guard run on a row).

Why segments: a prompt is evaluated as a fixed sequence of segments (see prompt.py). Leading
segments that match the previous prompt are kept in the KV cache and not evaluated again, and
because the split of every prompt is always the same, a cached segment gives bit-identical
logits to a fresh evaluation. So the shared-state path (many questions on one state) and the
policy-prefix path (one policy over many states) are exact, not approximations.

`fresh=True` clears the cache first: the reference path.
"""
from __future__ import annotations

import os
import time
from collections import OrderedDict, defaultdict
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence, TypedDict

import numpy as np

from adapter.engine import label_trie
from adapter.engine.guard_check import Judge, guard_check, skipped_guard
from adapter.engine.models import ModelChoice, Progress
from adapter.engine.prompt import Prompt, render_letters, render_option_words, render_policy_first, rotations
from adapter.schema import HEAD_LAYOUT, Debias, DecisionRequest, DecisionResult, HiddenState, JSONObject, RequestError, SharedStateRequest, finite
from adapter.engine.scores import PromptRun, combine, log_softmax
from adapter.engine.session import (Budget, EngineConfig, LlamaSession, ModelInfo, _after_policy_work, _count, _forecast,
                                    default_threads)

__all__ = ["Budget", "Engine", "EngineConfig", "ModelInfo", "default_threads", "resolve_settings", "skipped_guard"]

Extend = Callable[[tuple[int, ...]], tuple[np.ndarray, float]]  # label tokens -> (logits after them, seconds)
Tokens = tuple[int, ...]
Prepared = tuple[list[Tokens], list[Tokens]]  # (prompt segments, answer-label token sequences) as token ids
RowSettings = tuple[str, Debias, Sequence[list[int] | None]]  # (readout, debias, option orders) of a row
# a row's plan: (row, readout, debias, its first prompt's index, its prompts, content-free priors per order)
RowPlan = tuple[DecisionRequest, str, Debias, int, int, list[np.ndarray] | None]


class WalkStats(TypedDict):
    """What telling options apart cost one prompt (`Engine._walk`), added to its run."""

    forward_seconds: float
    extra_evals: int

# "Calibrate Before Use" (Zhao et al. 2021): the answer a prompt gets with no content is its bias.
CONTENT_FREE_STATES = ("N/A", "none", "[MASK]")
PRIOR_CACHE_SIZE = 512
CHARS_PER_TOKEN_MAX = 16  # no tokenizer packs more on average: longer prompts are refused untokenized


class Engine(LlamaSession):
    """One loaded GGUF that scores decisions. Thread-safe: calls are serialised (a llama.cpp context is not)."""

    generation: int = 0  # set by the workbench's model pool: a reloaded model is a new generation
    # shared label prefixes evaluated as one trie batch (label_trie.py); False: one decode per prefix,
    # the earlier path (kept as the reference bench.options and the tests compare with)
    label_batch: bool = True

    def __init__(self, model: str | os.PathLike[str] | ModelChoice | None = None, config: EngineConfig | None = None,
                 progress: Progress | None = None):
        """`progress(done, total)` reports the one-time assembly of a chunked shipped model."""
        super().__init__(model, config, progress)
        self._priors: OrderedDict[str, np.ndarray] = OrderedDict()  # content-free priors, LRU

    # -- scoring ----------------------------------------------------------------------------
    def render(self, req: DecisionRequest, readout: str, order: list[int] | None = None) -> Prompt:
        """The row's prompt. Examples are shown when `few_shot` says so, else by readout (option-words
        shows them, letters does not - the measured defaults, kept so old prompts stay the same)."""
        if req.layout == HEAD_LAYOUT:
            return render_policy_first(req.state, req.question, req.options, self.chat)
        shown = req.examples if (req.few_shot if req.few_shot is not None else readout == "option-words") else []
        if readout == "letters":
            return render_letters(req.state, req.question, req.options, self.chat, order, shown)
        return render_option_words(req.state, req.question, req.options, shown, order)

    def _prepare(self, prompt: Prompt) -> Prepared:
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
                 hidden: frozenset[int] = frozenset()) -> list[PromptRun]:
        """Score prompts in order. Consecutive prompts that differ only in their last segment (several
        questions on one state, the option orders of a permutation) are evaluated as parallel
        sequences on their shared prefix, up to `n_parallel` at a time. The prompts at the indices in
        `hidden` also return their last token's hidden state, read from the decode that gives their
        logits (session._HiddenTap; else from a second one-token decode, `_hidden_at`)."""
        # the same prompt twice in one call is evaluated once
        unique: dict[tuple[tuple[str, ...], tuple[str, ...], str], int] = {}
        firsts = [unique.setdefault((tuple(p.segments), tuple(p.labels), p.version), i) for i, p in enumerate(prompts)]
        if len(unique) < len(prompts):
            keep = list(unique.values())
            wanted = frozenset(keep.index(firsts[i]) for i in hidden)
            distinct = self.evaluate([prompts[i] for i in keep], budget, wanted)
            by_first = dict(zip(unique.values(), distinct))
            return [by_first[f].copy() for f in firsts]
        prepared = [self._prepare(p) for p in prompts]
        _count(budget, planned=self._planned(prepared))
        out: list[PromptRun] = []
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
                wants = any(k in hidden for k in range(i, j))
                logits, cached, seconds, states = self._forward_parallel([p[0] for p in prepared[i:j]], budget, wants)
                free = self.llm.n_ctx() - n_head - sum(len(p[0][-1]) for p in prepared[i:j])
                try:
                    for k in range(i, j):  # the first pays for the prefix; the others reuse it
                        end = n_head + len(prepared[k][0][-1])
                        extend = (lambda path, seq=k - i + 1, at=end: self._extend(seq, at, path, budget))
                        out.append(self._finish(prompts[k], *prepared[k], logits[k - i], cached if k == i else n_head,
                                                seconds / (j - i), budget, extend, fork=(k - i + 1, end, free)))
                        if k in hidden:
                            out[-1]["hidden"] = (states[k - i] if states is not None else
                                                 self._hidden_at(k - i + 1, end - 1, prepared[k][0][-1][-1], budget))
                finally:
                    self._drop_suffixes(j - i)
            else:
                logits1, cached1, seconds1 = self._forward(prepared[i][0], budget, hidden=i in hidden)
                state = self._cached_hidden
                n_in = sum(len(s) for s in prepared[i][0])
                out.append(self._finish(prompts[i], *prepared[i], logits1, cached1, seconds1, budget,
                                        fork=(0, n_in, self.llm.n_ctx() - n_in)))
                if i in hidden and state is not None:
                    out[-1]["hidden"] = state.copy()
                elif i in hidden:
                    segs = prepared[i][0]
                    out[-1]["hidden"] = self._hidden_at(0, n_in - 1, segs[-1][-1], budget)
                    # the last segment's cells are no longer the decision pass's: keep only what is
                    self._cached, self._cached_logits = list(segs[:-1]), None
                    self.llm.n_tokens = sum(len(s) for s in segs[:-1])
            i = j
        return out

    def _planned(self, prepared: list[Prepared]) -> int:
        """About how many tokens `evaluate` will have llama.cpp evaluate for these prompts: segments
        not in the cache (a prefix shared by several prompts once) plus their shared label prefixes.
        Only for the deadline's message: how far a request got of what it asked for."""
        seen: set[tuple[Tokens, ...]] = set()
        total = 0
        for segs, seqs in prepared:
            for k in range(len(segs)):
                head = tuple(segs[: k + 1])
                if head not in seen and self._cached[: k + 1] != list(head):
                    total += len(segs[k])
                seen.add(head)
            total += len(label_trie.inner_paths(seqs))
        return total

    def _finish(self, prompt: Prompt, segs: list[Tokens], seqs: list[Tokens], logits: np.ndarray, cached: int,
                seconds: float, budget: Budget | None, extend: Extend | None = None,
                fork: tuple[int, int, int] | None = None) -> PromptRun:
        """A prompt's result from its last-position logits; options sharing label tokens are told
        apart by `_walk`. With `fork` = (the prompt's sequence, its end position, free KV cells) and
        `label_batch` on, every shared prefix is evaluated first, as one trie batch
        (`_forward_labels`), and the walk reads those logits; `extra_evals` then counts decodes."""
        stats: WalkStats = {"forward_seconds": seconds, "extra_evals": 0}
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
        logp = log_softmax(logits)
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

    def _walk(self, segs: list[Tokens], seqs: list[Tokens], members: list[int], depth: int, logits: np.ndarray,
              prefix: Tokens, scores: np.ndarray, stats: WalkStats, budget: Budget | None = None,
              extend: Extend | None = None) -> None:
        """Score options by their label tokens; options sharing a first token are told apart by
        evaluating that token and reading the next one (log-probabilities added to the raw logit).
        `extend` evaluates the shared tokens on the prompt's own sequence of a parallel batch;
        without it the prompt is the cached one and only the shared tokens are evaluated too."""
        base = logits.astype(np.float64) if depth == 0 else log_softmax(logits)
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
        return resolve_settings(req.readout, req.debias, self.info.default_readout, self.info.default_debias, req.layout)

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
        prior: np.ndarray = np.mean([r["probs"] for r in runs], axis=0)
        self._priors[key] = prior
        while len(self._priors) > PRIOR_CACHE_SIZE:
            self._priors.popitem(last=False)
        return prior

    def score(self, req: DecisionRequest, *, fresh: bool = False, budget: Budget | None = None) -> DecisionResult:
        """Score one row. Same input -> same output, bit for bit, cached or fresh."""
        return self.score_many([req], fresh=fresh, budget=budget)[0]

    def score_many(self, rows: list[DecisionRequest], *, fresh: bool = False, budget: Budget | None = None,
                   together: bool = False, guard_when: Callable[[int, DecisionResult], bool] | None = None,
                   judge_for: Callable[[int], Judge | None] | None = None) -> list[DecisionResult]:
        """Score rows in order, as one unit of work: content-free priors first (so that rows sharing a
        state still find it in the KV cache), then the rows. A row's own prompts (the option orders
        of a permutation) are always evaluated together where they share a prefix. With `together`
        (several questions on one state: /v1/systemone, shared-state requests) prompts of different
        rows are too - faster, but a row's last bits then depend on its companions; without it each
        row gives exactly what it gives alone (what calibration measured).
        `budget.check()` is called between forward passes and raises to stop early.
        Rows that ask for a steering guard get it after all rows are scored (so the guard's passes
        never change a row's bits), unless `guard_when(i, result)` says no (the adapter skips rows
        its calibrated policy gates anyway); `judge_for(i)` gives what row i's guard compares (its policy's
        head or correction, guard_check.Judge), else the model's own answer."""
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
                            judge = judge_for(i) if judge_for is not None and run else None
                            res.guard = (self.guard_check(req, res, budget, judge=judge) if run
                                         else skipped_guard(req.guard))
                return results
            finally:
                self._restore, self._budget = True, None

    def _score_many(self, rows: list[DecisionRequest], budget: Budget | None, together: bool) -> list[DecisionResult]:
        t0 = time.perf_counter()
        settings: list[RowSettings] = []
        rendered: list[list[Prompt]] = []
        for i, req in enumerate(rows):  # every row checked before any work, errors naming their row
            try:
                readout, debias = self.settings(req)
                orders: Sequence[list[int] | None] = rotations(len(req.options)) if req.permute else [None]
                row_prompts = [self.render(req, readout, order) for order in orders]
                self._prepare(row_prompts[0])
            except RequestError as exc:
                exc.row = i
                raise
            settings.append((readout, debias, orders))
            rendered.append(row_prompts)
        _forecast(budget, lambda: self._forecast(rows, settings, rendered))
        plans: list[RowPlan] = []
        prompts: list[Prompt] = []
        for i, (req, (readout, debias, orders), row_prompts) in enumerate(zip(rows, settings, rendered)):
            with _row(i):
                priors = [self.prior(req, readout, o, budget) for o in orders] if debias == "content-free" else None
            plans.append((req, readout, debias, len(prompts), len(orders), priors))
            prompts += row_prompts
        _after_policy_work(budget)  # the priors are kept: a request admitted only for them stops here
        if together:
            # a canonical order: prompts that share a prefix sit together, and the batches (so the
            # bits) do not depend on the order in which a request listed its questions
            canon = sorted(range(len(prompts)), key=lambda i: (prompts[i].segments[:-1], prompts[i].segments[-1],
                                                               prompts[i].labels))
            firsts = {at for req, _, _, at, _, _ in plans if req.hidden_state}  # a row's request-order prompt
            wanted = frozenset(pos for pos, i in enumerate(canon) if i in firsts)
            by_prompt = dict(zip(canon, self.evaluate([prompts[i] for i in canon], budget, wanted)))
            runs = [by_prompt[i] for i in range(len(prompts))]
        else:
            runs = []
            i = 0
            while i < len(plans):
                j = i + 1
                if self.row_batch > 1 and _batchable(plans[i]):
                    while j < len(plans) and j - i < self.row_batch and _batchable(plans[j]):
                        j += 1
                at = plans[i][3]
                end = plans[j - 1][3] + plans[j - 1][4]
                wanted = frozenset(plan[3] - at for plan in plans[i:j] if plan[0].hidden_state)
                with _row(i):  # rows that share the policy's prefix are decoded together (`evaluate`)
                    runs += self.evaluate(prompts[at:end], budget, wanted)
                i = j
        seconds = (time.perf_counter() - t0) / max(1, len(rows))
        return [self._result(req, readout, debias, runs[at: at + n], priors, seconds)
                for req, readout, debias, at, n, priors in plans]

    def _forecast(self, rows: list[DecisionRequest], settings: list[RowSettings],
                  rendered: list[list[Prompt]]) -> tuple[int, int]:
        """About how many tokens scoring these rows evaluates, before any is - the rows' prompts and the
        content-free priors not cached yet (3 passes each) - and how many of them are those priors (the
        policy's work, kept once done). Prompts are not changed, only counted."""
        prompts = [p for row_prompts in rendered for p in row_prompts]
        priors: list[Prompt] = []
        for req, (readout, debias, orders) in zip(rows, settings):
            if debias == "content-free":
                for order in orders:
                    if self.render(req.model_copy(update={"state": "\x00"}), readout, order).sha256() not in self._priors:
                        priors += [self.render(req.model_copy(update={"state": s}), readout, order)
                                   for s in CONTENT_FREE_STATES]
        total = self._planned([self._prepare(p) for p in prompts + priors])
        return total, (self._planned([self._prepare(p) for p in priors]) if priors else 0)

    def _result(self, req: DecisionRequest, readout: str, debias: Debias, runs: list[PromptRun],
                priors: list[np.ndarray] | None, seconds: float) -> DecisionResult:
        raw_probs = [r["probs"] for r in runs]
        probs, logits = combine(runs, priors)
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
                    use_precheck: bool = True, exhaustive: bool = False, judge: Judge | None = None) -> JSONObject:
        """The steering guard for one scored row (guard_check.py): JSON, as the response carries it."""
        return guard_check(self, req, result, budget, use_precheck=use_precheck, exhaustive=exhaustive, judge=judge)

    def score_shared(self, shared: SharedStateRequest, budget: Budget | None = None) -> list[DecisionResult]:
        """Many questions on one state: the state segment is evaluated once, the questions together."""
        return self.score_many(shared.rows(), budget=budget, together=True)


def resolve_settings(readout: str | None, debias: str | None, default_readout: str,
                     default_debias: str, layout: str | None = None) -> tuple[str, Debias]:
    """(readout, debias) a row is read with: its own, else the model's measured defaults. The default
    debias belongs to the default readout; another readout asked for by name gets none; the head
    layout is always letters with no correction. Pure, so the workbench can tell which stored results
    a request would reproduce (app/core/reuse.py)."""
    if layout == HEAD_LAYOUT:
        return "letters", "none"
    chosen = readout or default_readout
    if debias:
        return chosen, "content-free" if debias == "content-free" else "none"
    default: Debias = "content-free" if default_debias == "content-free" else "none"
    return chosen, (default if chosen == default_readout else "none")


def _batchable(plan: RowPlan) -> bool:
    """A head-layout row: one prompt, no correction, the policy's prefix shared with its neighbours."""
    req, _, debias, _, n, _ = plan
    return req.layout == HEAD_LAYOUT and n == 1 and debias == "none"


@contextmanager
def _row(i: int) -> Iterator[None]:
    """A RequestError raised while scoring row i names that row (the server then names its loc)."""
    try:
        yield
    except RequestError as exc:
        if exc.row is None:
            exc.row = i
        raise
