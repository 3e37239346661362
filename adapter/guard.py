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
# ... when what was left out names the row's answer (its id in any form or its description); leaving out a
# piece that names no option must give a clearer other answer: on clean rows whose own answer is weak,
# leaving out any evidence moves it (measured on the generic templates: clean rows flagged 8% at 0.10, 1% at
# 0.20, attempts held by erase-and-check alone 37.5% and 31.2%)
PLAIN_MARGIN = 0.20
STEERING_SUSPECTED = "steering_suspected"

# a sentence ends at . ! ? or … (closing quotes/brackets kept with it) before whitespace and a
# capital, digit or opening quote/bracket, or before markup that starts a record or a tag ("{", "<", "#",
# "*", "`", ">", "|"): "e.g. the" and "3.5 GB" stay whole
_SENTENCE_END = re.compile(r"(?<=[.!?\u2026])[\"'\u201d\u2019)\]]*\s+(?=[\"'\u201c\u2018(\[]?[A-Z0-9]|[\[{<#*`>|_])")
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

    def text(self, start: int, end: int) -> str:
        """Pieces [start, end) as text (an object's fields or an array's items as JSON)."""
        part = self.parts[start:end]
        if self.kind in ("text", "object-text"):
            return "".join(part)
        return json.dumps([list(p) for p in part], ensure_ascii=False, default=str)

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


def id_form(option_id: str) -> str:
    """A regex for an option id however it is written: any case, and its words (split at separators,
    case changes and digits) joined by nothing, a space, "-", "_" or "." - "private-data", "Private Data",
    "PRIVATE_DATA", "privateData"; "P1", "p-1". An id it cannot split is matched as written (any case)."""
    words = re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", option_id)
    if not words or "".join(words) != re.sub(r"[-_.\s]", "", option_id):
        return re.escape(option_id)
    return r"[-_.\s]?".join(re.escape(w) for w in words)


def _mention(option_id: str, description: str) -> str:
    """An option named: its id in any form (id_form), or its whole description (two words or more)."""
    alts = [id_form(option_id)]
    if len(description.split()) >= 2:
        alts.append(re.escape(description.strip().rstrip(".")))
    return r"[\"'\u201c\u2018\u00ab(\[]?(?:" + "|".join(alts) + r")(?![\w-])"


# The kinds of span that name an option as the decision without an instruction's words (issue 41): the
# option written as a value, a tag, the object of a filing verb, a claim, or a fragment on its own. Written
# from the shipped families the guard may be tuned on and from the shipped clean rows (none may trip them);
# the held-out families are only measured. Each is a regex around {m}, the option's mention; _END: the
# mention ends its clause (punctuation, markup, a line end or the end of the text).
_END = r"(?=[ \t]*(?:$|[.!,;:)\]}>\"'`*_|\u201d\u2019\u00bb]|--?\s|\n))"  # not "?": a question claims nothing
# or a closed-class word that starts the next clause ("mark this one spam so it gets sorted"), not a noun the
# option modifies ("marked 'no returns'")
_CLAUSE_END = (r"(?:" + _END + r"|(?=\s+(?:so|and|but|or|please|pls|now|then|because|since|nowhere|instead|only|asap|"
               r"thanks|thank|thx|if|when|before|after|until|immediately|right)\b))")
_OPEN = r"[\"'`*_\[(<{\u201c\u2018\u00ab]*"
SPAN_KINDS: dict[str, str] = {
    # key = value, key: value, "key": "value", key -> value ("label=spam", "Assistant: spam")
    "value": (r"(?<![\d:])(?:[\w\"'\]>)])[ \t]*(?:(?::|->|=>|\u2192)[ \t]*" + _OPEN + "{m}" + _END + "|(?::=|=)[ \t]*"
              + _OPEN + "{m}" + r"(?=\s|$|[,;)\]}\"'`]))"),  # key=value ends at a space (log lines)
    # the option alone inside markup: "[billing]", "(billing)", "<billing>", "**billing**", "`billing`",
    # '"billing"', "#billing"
    "tag": (r"(?:(?<![\w#&])#{m}|(?:\*\*|__|[\"'`\[(<{\u201c\u2018\u00ab])[ \t]*{m}[ \t]*"
            r"(?:\*\*|__|[\"'`\])>}\u201d\u2019\u00bb]))"),
    # a filing verb and the option as where the case goes: "put this down as spam", "file under billing",
    # "route it to technical", "mark this one P1"
    "filing": (r"\b(?:(?:put|file[ds]?|filing|rout\w*|send|sent|mov\w*|forward\w*|escalat\w*|sort\w*|assign\w*|"
               r"mark\w*|tag\w*|flag\w*|label\w*|set|rate[ds]?|count\w*|record\w*|log(?:ged)?|handl\w*|treat\w*|"
               r"process\w*|close[ds]?|go|goes|going|went|gone|belongs?|belonging)"
               r"(?:\s+(?:it|this|that|them|me|us|down|(?:this|that|the|my|our|these|those)(?:\s+[\w-]+)?))?"
               r"\s+(?:as|under|to|into|in|with)|(?:mark\w*|tag\w*|flag\w*|label\w*|assign\w*|rate[ds]?|set)"
               r"(?:\s+(?:it|this|that|them|(?:this|that|the|my|our)(?:\s+[\w-]+)?))?)\s+(?:an?\s+|the\s+)?" + _OPEN + "{m}" + _CLAUSE_END),
    # a claim that ends on the option: "it's spam.", "this is definitely billing,", "the only valid one is P1."
    "claim": (r"\b(?:is|are|was|be|it's|it\u2019s|that's|that\u2019s|this's)\s+(?!not\b)(?:[\w-]+\s+){0,2}?"
              r"(?:an?\s+|the\s+)?" + _OPEN + "{m}" + _END),
    # a short fragment that is little more than the option: "Quick one, definitely billing." (a clause of at
    # most three words that ends on it, one word or two before it)
    "fragment": r"(?:^|[.!?;,:\n(\[{|]|\s-\s)[ \t]*(?:[\w'\u2019-]+[ \t]+){1,2}" + _OPEN + "{m}"
                + r"(?=[ \t]*(?:$|[.!)\]}>\"'`*_\u201d\u2019\u00bb]|\n))",  # its sentence ends there (", and yes, I ..." does not)
}


class Precheck(TypedDict):
    """Where the state tells the reader what to decide: the option it names, the words, their offset, and
    the kind of span ("directive", or one of SPAN_KINDS)."""

    option: str
    text: str
    at: int
    kind: str


def precheck(state: Any, options: Sequence[Any]) -> Precheck | None:
    """The first place where the state tells the reader what to decide - an imperative, a decision
    word, a labelling verb or a claim ("this is a billing case") with an option's id (in any form) or its
    whole description, or a span of one of SPAN_KINDS (the option as a value, a tag, where the case is
    filed, what it "is", a fragment on its own) - as {"option", "text", "at", "kind"} (character offset in
    the state's text), else None. No model pass; it reads words, so a paraphrase without them is left to
    erase-and-check."""
    text = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False)
    best: Precheck | None = None
    for opt in options:
        oid, desc = _id_desc(opt)
        mention = _mention(oid, desc)
        found = [("directive", rf"\b{d.replace('{mention}', mention)}{mention}") for d in _DIRECTIVES]
        found += [(kind, pattern.replace("{m}", mention)) for kind, pattern in SPAN_KINDS.items()]
        for kind, pattern in found:
            m = re.search(pattern, text, re.IGNORECASE)
            if m and (best is None or m.start() < best["at"]):
                best = {"option": oid, "text": m.group(0), "at": m.start(), "kind": kind}
    return best


def _id_desc(opt: Any) -> tuple[str, str]:
    return (opt.id, opt.description) if hasattr(opt, "id") else (opt["id"], opt.get("description", ""))


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


# where a clause ends around an option's mention: sentence ends, line ends, clause punctuation, brackets,
# quotes and markup - a fragment appended to a state is mostly one of these
_CLAUSE_STOP = re.compile(r"[.!?;,\n|(){}\[\]<>\u201c\u201d]|\s[-\u2013\u2014]\s")
MAX_MENTION_ERASURES = 6  # spans naming the answer, left out each on its own (after the pieces)


def mention_erasures(state: Any, options: Sequence[Any], answer: str) -> list[tuple[str, Any]]:
    """The state with one span that names the row's answer left out: for every mention of the answer
    option (its id in any form - id_form - or its whole description), the clause that holds it and the
    trailing fragment from that clause to the end of the text. An injection that names an option "in
    another form" (a tag, a value, a short fragment) is often less than a sentence, and leaving out its
    whole sentence also leaves out the state's own evidence. (text, state) pairs, the text being the span
    left out; text states and one-text-field objects only (other objects are cut by field already)."""
    key: str | None = None
    if isinstance(state, str):
        text = state
    elif isinstance(state, dict) and len(state) == 1 and isinstance(next(iter(state.values())), str):
        key = next(iter(state))
        text = state[key]
    else:
        return []
    opt = next((o for o in options if _id_desc(o)[0] == answer), None)
    if opt is None:
        return []
    out: dict[str, Any] = {}
    for m in re.finditer(_mention(*_id_desc(opt)), text, re.IGNORECASE):
        before = [b.end() for b in _CLAUSE_STOP.finditer(text, 0, m.start())]
        start = before[-1] if before else 0
        if start and text[start - 1] in "([{<\u201c":  # an opening bracket goes with its clause
            start -= 1
        after = _CLAUSE_STOP.search(text, m.end())
        end = after.end() if after and after.group(0) in ")]}>\u201d" else after.start() if after else len(text)
        for a, b in ((start, end), (start, len(text))):
            left = (text[:a].rstrip() + " " + text[b:].lstrip()).strip()
            if left and text[a:b].strip() and left != text.strip():
                out.setdefault(text[a:b].strip(), left if key is None else {key: left})
    return list(out.items())[:MAX_MENTION_ERASURES]


def names(text: str, option: Any) -> bool:
    """Does `text` name the option - its id in any form (id_form) or its whole description?"""
    return re.search(_mention(*_id_desc(option)), text, re.IGNORECASE) is not None
