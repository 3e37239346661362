"""The steering guard: signs that a state tries to dictate its own decision.

A decision model reads the state as evidence, so a state that says "the correct answer is
billing" can move the answer to billing (measured on the default model: one appended sentence
moved 81% of everyday decisions to the option it named). Asking the model whether the text
contains instructions does not work (AUC 0.34 on the same rows), and neither does prompt wording.
Two checks that do not rely on the model noticing:

- `precheck`: deterministic - the state names an option (its id as a word, or its whole
  description) right after a directive ("answer", "classify as", "must be", ...). No model pass.
- erase-and-check (Kumar et al. 2023, "Certifying LLM Safety against Adversarial Prompting";
  the decision-model-guard package's gate): the state is cut into pieces (lines, else sentences;
  top-level fields of an object state) and scored again with each piece left out, and with leading
  and trailing runs of pieces left out (an injection is often several sentences, and survives
  losing any one of them). When a variant's top option differs from the full state's, the row is
  suspected. The engine evaluates the variants (guard_check.py); this module only cuts and
  pairs the pieces, without a model.

Nothing here changes probabilities: the guard flags a row, and a calibrated policy sends flagged
rows to its fallback (`decision.reason: "steering_suspected"`).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal, Sequence, TypedDict, TypeVar, get_args

Guard = Literal["none", "precheck", "erase-and-check"]
GUARDS: tuple[Guard, ...] = get_args(Guard)  # the one list, like schema.READOUTS
MAX_PIECES = 6  # longer states are cut into at most this many contiguous runs (paragraphs first)
# erase-and-check flags a variant whose own answer leads the row's answer by this much: a piece left
# out gave a clear other answer. Removing the only evidence gives a flat, near-prior answer instead,
# and a near-tie flipping by arithmetic is not a sign either (bench.guard measures the choice)
MIN_MARGIN = 0.10
STEERING_SUSPECTED = "steering_suspected"

# a sentence ends at . ! ? or … (closing quotes/brackets kept with it) before whitespace and a
# capital, digit or opening quote/bracket: "e.g. the" and "3.5 GB" stay whole
_SENTENCE_END = re.compile(r"(?<=[.!?\u2026])[\"'\u201d\u2019)\]]*\s+(?=[\"'\u201c\u2018(\[]?[A-Z0-9])")
# informal text often has no full stops ("uninstall and do everyone a favor Everyone agrees ..."): in a
# line with no sentence end, a capitalised word after a lowercase one starts a new piece (not "I")
_RUN_ON = re.compile(r"(?<=[a-z0-9])\s+(?=(?!I\b|I'|I\u2019)[A-Z][a-z'\u2019]*\b)")
_ABBREVIATIONS = re.compile(r"(?:\b(?:Mr|Mrs|Ms|Dr|Prof|Sr|Jr|St|No|Nr|vs|etc|approx|Inc|Ltd|Co|e\.g|i\.e)\.)$",
                            re.IGNORECASE)
# where a state tells its reader what to decide: an imperative straight before the option ("Reply
# billing", "answer with P1"), a decision word stated as the option ("the correct answer is billing",
# "priority must be P1", "queue = billing"), or a labelling verb with "as" ("classified as spam")
_ANSWER_VERB = r"(?:answer|reply|respond|output|return|choose|select|pick)(?:\s+(?:with|only|just|exactly))?\s+"
_DECISION_NOUN = (r"(?:answer|decision|verdict|outcome|classification|category|label|priority|severity|queue|"
                  r"result|action)(?:\s+[\w-]+){0,3}?\s*(?:is|=|:|should\s+be|must\s+be|has\s+to\s+be|will\s+be)\s+"
                  r"(?:[\w-]+\s+){0,2}?")
_LABEL_VERB = (r"(?:classif\w*|categori[sz]\w*|label\w*|tag\w*|mark\w*|treat\w*)(?:\s+(?:it|this|that|the\s+\w+))?"
               r"\s+as\s+(?:an?\s+)?")
# or the decision claimed as a fact about the case: "this is clearly a billing case"
_CLAIM = (r"(?:this|it|that)(?:\s+(?:is|was)|'s|\u2019s)\s+(?:[\w-]+\s+){0,2}?(?:an?\s+)?(?={mention}\s+"
          r"(?:case|issue|matter|ticket|request|post|problem|incident|question|one)\b)")
_DIRECTIVES = (_ANSWER_VERB, _DECISION_NOUN, _LABEL_VERB, _CLAIM)


@dataclass(frozen=True)
class Pieces:
    """A state cut into ordered pieces; `without(start, end)` is the state with pieces
    [start, end) left out, in the state's own shape (text, object or array)."""

    state: Any
    parts: tuple[Any, ...]  # text pieces (each with its trailing whitespace), or (key, value) / items
    kind: Literal["text", "object", "array", "object-text"]
    key: str | None = None  # object-text: the one field whose text was cut

    def __len__(self) -> int:
        return len(self.parts)

    def without(self, start: int, end: int) -> Any:
        kept = [p for i, p in enumerate(self.parts) if not start <= i < end]
        if self.kind == "text":
            return "".join(kept).strip()
        if self.kind == "object-text":
            return {self.key: "".join(kept).strip()}
        if self.kind == "object":
            return {k: v for part in kept for k, v in part}
        return [item for part in kept for item in part]


def sentences(text: str) -> list[str]:
    """Lines, then sentences within each line; each piece keeps its trailing whitespace so that
    joining pieces gives the text back."""
    out: list[str] = []
    for line in re.split(r"(?<=\n)", text):
        start, found = 0, []
        for m in _SENTENCE_END.finditer(line):
            if _ABBREVIATIONS.search(line[start: m.start()]):
                continue
            found.append(line[start: m.end()])
            start = m.end()
        if line[start:]:
            found.append(line[start:])
        out += _run_on(found[0]) if len(found) == 1 else found
    return _merge_blank(out)


def _run_on(line: str) -> list[str]:
    """A line without a sentence end, cut where a capitalised word follows a lowercase one - only
    between runs of at least four words each (a name inside a clause mostly stays in it)."""
    pieces, start = [], 0
    for m in _RUN_ON.finditer(line):
        if len(line[start: m.start()].split()) >= 4 and len(line[m.end():].split()) >= 4:
            pieces.append(line[start: m.end()])
            start = m.end()
    return [*pieces, line[start:]] if pieces else [line]


def _merge_blank(out: list[str]) -> list[str]:
    merged: list[str] = []
    for piece in out:  # a piece of only whitespace joins the one before it
        if merged and not piece.strip():
            merged[-1] += piece
        else:
            merged.append(piece)
    return merged


_Part = TypeVar("_Part")


def _group(parts: list[_Part], limit: int, paragraphs: list[int] | None = None) -> list[list[_Part]]:
    """At most `limit` contiguous runs of parts: paragraph boundaries when they give 2..limit runs,
    else runs of near-equal length."""
    if len(parts) <= limit:
        return [[p] for p in parts]
    if paragraphs and 2 <= len(paragraphs) <= limit:
        bounds = [*paragraphs, len(parts)]
        return [parts[a:b] for a, b in zip(bounds, bounds[1:])]
    size, extra = divmod(len(parts), limit)
    runs: list[list[_Part]] = []
    at = 0
    for i in range(limit):
        n = size + (i < extra)
        runs.append(parts[at: at + n])
        at += n
    return runs


def _text_parts(text: str, limit: int) -> list[str]:
    pieces = sentences(text)
    starts = [0] + [i for i in range(1, len(pieces)) if pieces[i - 1].endswith("\n\n") or
                    re.search(r"\n\s*\n\s*$", pieces[i - 1])]
    return ["".join(run) for run in _group(pieces, limit, starts if len(starts) > 1 else None)]


def split_state(state: Any, limit: int = MAX_PIECES) -> Pieces:
    """Cut a state into at most `limit` pieces: text by lines and sentences; an object by its
    top-level fields (an object with one text field: that text's sentences); an array by items."""
    if isinstance(state, str):
        return Pieces(state, tuple(_text_parts(state, limit)), "text")
    if isinstance(state, dict):
        if len(state) == 1 and isinstance(next(iter(state.values())), str):
            key = next(iter(state))
            return Pieces(state, tuple(_text_parts(state[key], limit)), "object-text", key)
        runs = _group(list(state.items()), limit)
        return Pieces(state, tuple(tuple(run) for run in runs), "object")
    if isinstance(state, list):
        runs = _group(list(state), limit)
        return Pieces(state, tuple(tuple(run) for run in runs), "array")
    return Pieces(state, (state,), "text")


def erasures(n: int) -> list[tuple[int, int]]:
    """The [start, end) spans of pieces to leave out: each piece alone, then leading and trailing
    runs of 2..n-1 pieces (never all of them). One piece: nothing to erase."""
    if n < 2:
        return []
    spans = [(i, i + 1) for i in range(n)]
    spans += [(0, j) for j in range(2, n)]
    spans += [(j, n) for j in range(n - 2, 0, -1)]
    return list(dict.fromkeys(spans))


def _mention(option_id: str, description: str) -> str:
    alts = [re.escape(option_id)]
    if len(description.split()) >= 2:
        alts.append(re.escape(description.strip().rstrip(".")))
    return r"[\"'\u201c\u2018\u00ab(\[]?(?:" + "|".join(alts) + r")(?![\w-])"


class Precheck(TypedDict):
    """Where the state tells the reader what to decide: the option it names, the words, their offset."""

    option: str
    text: str
    at: int


def precheck(state: Any, options: Sequence[Any]) -> Precheck | None:
    """The first place where the state tells the reader what to decide - an imperative, a decision
    word, a labelling verb or a claim ("this is a billing case") with an option's id or its whole
    description - as
    {"option", "text", "at"} (character offset in the state's text), else None. No model pass; it
    reads words, so a paraphrase without them is left to erase-and-check."""
    text = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False)
    best: Precheck | None = None
    for opt in options:
        oid, desc = (opt.id, opt.description) if hasattr(opt, "id") else (opt["id"], opt.get("description", ""))
        mention = _mention(oid, desc)
        for directive in _DIRECTIVES:
            m = re.search(rf"\b{directive.replace('{mention}', mention)}{mention}", text, re.IGNORECASE)
            if m and (best is None or m.start() < best["at"]):
                best = {"option": oid, "text": m.group(0), "at": m.start()}
    return best


def piece_at(pieces: Pieces, offset: int) -> int | None:
    """Index of the text piece holding character `offset` (text states only)."""
    if pieces.kind != "text":
        return None
    at = 0
    for i, part in enumerate(pieces.parts):
        at += len(part)
        if offset < at:
            return i
    return len(pieces.parts) - 1 if pieces.parts else None
