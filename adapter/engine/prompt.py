"""Prompt rendering for each readout, split into segments the engine evaluates in order.

A prompt is a list of text segments. The engine evaluates segments one after the other and
keeps the KV cache of leading segments that match the previous prompt, so a segment boundary
is also a reuse point. Because every prompt is always evaluated with the same split, a cached
segment gives bit-identical results to a fresh evaluation.

- `letters` (SemIf's direct-options readout): fixed system instruction, the state, the question
  and the lettered options through the model's chat template (thinking off); the answer is read at
  the letter tokens. Segment 0 holds the state, so many questions on one state share it.
- `letters`, policy first (the *head layout*, `layout: "policy-first"`): the instruction, question and
  lettered options first, the state last, then a short tail. Only a learned head reads it (zero-shot,
  the state-first order is the accurate one: 23-37 points better on the default model); for a head it
  costs at most a point and each row evaluates only its state and the tail, the policy being cached.
- `option-words`: a completion prompt listing the options by id, with solved examples, then the
  state and `Answer:`; the answer is read at the first token(s) of each option id. Segment 0 holds
  the policy (question, options, examples), so one policy over many states shares it. Without
  examples the state comes first instead, so many questions on one state share it.
"""
from __future__ import annotations

import hashlib
import string
from dataclasses import dataclass, field
from datetime import datetime
from typing import NoReturn, TypedDict

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from adapter.schema import Example, Option, State, state_text

PROMPT_VERSIONS = {"letters": "letters/1", "letters-examples": "letters-examples/1", "option-words": "option-words/1",
                   "option-words-state-first": "option-words-state-first/1",
                   "letters-policy-first": "letters-policy-first/1"}
LETTERS = string.ascii_uppercase
SYSTEM_INSTRUCTION = (
    "You are a decision model. Read the state, then answer the question by choosing exactly one "
    "of the listed options. Reply with the letter of that option only."
)
OPTION_WORDS_INSTRUCTION = "Answer each case with the id of exactly one option from the list."
_SEGMENT = "\u27e6SEMIF-SEGMENT\u27e7"  # split marker, removed before tokenizing
_USER, _END_USER = "\u27e6SEMIF-TEXT\u27e7", "\u27e6/SEMIF-TEXT\u27e7"  # around text that must not become control tokens
_MARKERS = (_SEGMENT, _USER, _END_USER)
Piece = tuple[str, bool]  # (text, is_text): text pieces are tokenized with special=False


def text(s: str) -> str:
    """Mark content as plain text: whatever it contains (`<|im_end|>`, `<start_of_turn>`) is
    tokenized as ordinary characters, never as the chat template's control tokens."""
    for m in _MARKERS:
        s = s.replace(m, "")
    return f"{_USER}{s}{_END_USER}"


def split_marked(marked: str) -> list[list[Piece]]:
    """Segments of (text, is_text) pieces from a rendered string with segment and text markers."""
    segments: list[list[Piece]] = []
    inside = False
    for seg in marked.split(_SEGMENT):
        pieces: list[Piece] = []
        for i, part in enumerate(seg.replace(_END_USER, _USER).split(_USER)):
            if i:
                inside = not inside
            if part:
                pieces.append((part, inside))
        segments.append(pieces)
    return segments


@dataclass
class Prompt:
    readout: str
    version: str
    pieces: list[list[Piece]]  # segments, each a list of (text, is_text) pieces
    labels: list[str]  # answer text read right after the prompt, one per option in displayed order
    chat: bool = False
    order: list[int] = field(default_factory=list)  # displayed position -> request option index

    @property
    def segments(self) -> list[str]:
        return ["".join(t for t, _ in seg) for seg in self.pieces]

    @property
    def text(self) -> str:
        return "".join(self.segments)

    def merged(self) -> "Prompt":
        """The same prompt with every segment after the first joined into one: prompts that differ
        anywhere after the first segment (the steering guard's variants of one state) then share
        that segment and are evaluated together as parallel sequences. Tokens are unchanged (each
        piece is tokenized on its own); only where the KV cache may be reused differs."""
        if len(self.pieces) <= 2:
            return self
        tail = [piece for seg in self.pieces[1:] for piece in seg]
        return Prompt(self.readout, self.version, [self.pieces[0], tail], self.labels, self.chat, self.order)

    def sha256(self) -> str:
        """Identity of the prompt as evaluated: version, segments (text and split) and answer labels."""
        h = hashlib.sha256(self.version.encode())
        for part in (*self.segments, "\x1f", *self.labels):
            h.update(b"\x1e" + part.encode())
        return h.hexdigest()


class ChatMessage(TypedDict):
    """One chat turn, the shape chat templates and chat-completions servers read."""

    role: str
    content: str


class ChatTemplate:
    """The model's own Jinja chat template (from GGUF metadata), rendered the way HF does."""

    def __init__(self, template: str, bos_token: str = "", eos_token: str = ""):
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._tpl = env.from_string(template)
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(self, messages: list[ChatMessage]) -> str:
        """Render with a generation prompt and thinking off. Templates that reject a system role
        (e.g. Gemma's) get the system text merged into the first user message instead."""
        kw = dict(add_generation_prompt=True, enable_thinking=False, bos_token=self.bos_token, eos_token=self.eos_token)
        try:
            return self._tpl.render(messages=messages, **kw)
        except jinja2.TemplateError:
            if not messages or messages[0]["role"] != "system":
                raise
            merged: list[ChatMessage] = [
                {"role": "user", "content": messages[0]["content"] + "\n\n" + messages[1]["content"]}, *messages[2:]]
            return self._tpl.render(messages=merged, **kw)

    def works(self) -> bool:
        """Whether this template renders a plain exchange at all (some need features we lack)."""
        try:
            return "probe" in self.render([{"role": "system", "content": "s"}, {"role": "user", "content": "probe"}])
        except Exception:
            return False


def _raise(msg: str) -> NoReturn:
    raise jinja2.TemplateError(msg)


def option_line(letter: str, opt: Option) -> str:
    return f"{letter}. {opt.id}: {opt.description}" if opt.description else f"{letter}. {opt.id}"


def letters_user_parts(state: State, question: str, shown: list[Option]) -> tuple[str, str, str]:
    """The letters readout's user message in three parts: ("State:" header, the state, the question
    with its lettered options). A chat-completions target sends the same text joined."""
    body = "\n".join(option_line(LETTERS[k], o) for k, o in enumerate(shown))
    return "State:\n", f"{state_text(state)}\n\n", f"Question: {question}\n\nOptions:\n{body}\n\nAnswer with one letter."


def letters_messages(state: State, question: str, options: list[Option],
                     examples: list[Example] | None = None) -> list[ChatMessage]:
    """The letters prompt as chat messages, for servers that apply the chat template themselves."""
    turns: list[ChatMessage] = []
    for ex in examples or []:
        turns += [{"role": "user", "content": "".join(letters_user_parts(ex.state, question, options))},
                  {"role": "assistant", "content": _letter_of(ex.option_id, options)}]
    return [{"role": "system", "content": SYSTEM_INSTRUCTION}, *turns,
            {"role": "user", "content": "".join(letters_user_parts(state, question, options))}]


def _letter_of(option_id: str, shown: list[Option]) -> str:
    return LETTERS[[o.id for o in shown].index(option_id)]


def render_letters(state: State, question: str, options: list[Option], chat: ChatTemplate | None,
                   order: list[int] | None = None, examples: list[Example] | None = None) -> Prompt:
    """Segments: [instruction up to "State:"] [the state] [question, options, answer header], so
    the instruction is shared by every row and the state by every question asked of it.

    Solved examples, when given, are earlier exchanges - the same user message for the example's
    state, answered with its letter - before the case, so they sit in the first segment: cached
    with the instruction, they add nothing per row but the attention over a longer context."""
    order = order or list(range(len(options)))
    shown = [options[i] for i in order]
    head, body, ask = letters_user_parts(state, question, shown)
    user = text(head) + _SEGMENT + text(body) + _SEGMENT + text(ask)
    solved = [("".join(letters_user_parts(ex.state, question, shown)), _letter_of(ex.option_id, shown))
              for ex in examples or []]
    version = PROMPT_VERSIONS["letters-examples" if solved else "letters"]
    if chat is not None:
        turns: list[ChatMessage] = [m for case, letter in solved for m in (
            ChatMessage(role="user", content=text(case)), ChatMessage(role="assistant", content=text(letter)))]
        marked = chat.render([{"role": "system", "content": text(SYSTEM_INSTRUCTION)}, *turns,
                              {"role": "user", "content": user}])
        labels = list(LETTERS[: len(shown)])  # read straight after the assistant header
    else:
        shots = "".join(f"{case}\nAnswer: {letter}\n\n" for case, letter in solved)
        marked = text(f"{SYSTEM_INSTRUCTION}\n\n{shots}") + user + text("\nAnswer:")
        labels = [f" {c}" for c in LETTERS[: len(shown)]]
    return Prompt("letters", version, split_marked(marked), labels, chat is not None, order)


POLICY_FIRST_INSTRUCTION = (
    "You are a decision model. Read the question and its options, then the state, and answer by choosing "
    "exactly one of the listed options. Reply with the letter of that option only."
)


def render_policy_first(state: State, question: str, options: list[Option], chat: ChatTemplate | None) -> Prompt:
    """The head layout. Segments: [instruction, question, lettered options, "State:"] [the state and a
    short tail], so one policy's prefix is evaluated once per model and each row pays for its state
    plus ~10 tokens. The answer is still read at the letters (a linc/stacked head reads them), but
    these probabilities are not offered zero-shot: a learned head reads the last token's hidden state."""
    shown = list(options)
    body = "\n".join(option_line(LETTERS[k], o) for k, o in enumerate(shown))
    policy = f"Question: {question}\n\nOptions:\n{body}\n\nState:\n"
    case = f"{state_text(state)}\n\nAnswer with one letter."
    if chat is not None:
        user = text(policy) + _SEGMENT + text(case)
        marked = chat.render([{"role": "system", "content": text(POLICY_FIRST_INSTRUCTION)},
                              {"role": "user", "content": user}])
        labels = list(LETTERS[: len(shown)])
    else:
        marked = text(f"{POLICY_FIRST_INSTRUCTION}\n\n{policy}") + _SEGMENT + text(f"{case}\nAnswer:")
        labels = [f" {c}" for c in LETTERS[: len(shown)]]
    return Prompt("letters", PROMPT_VERSIONS["letters-policy-first"], split_marked(marked), labels, chat is not None,
                  list(range(len(shown))))


def render_option_words(state: State, question: str, options: list[Option], examples: list[Example],
                        order: list[int] | None = None) -> Prompt:
    """With solved examples the policy goes first (examples must precede the case), and one policy
    over many states shares that segment. Without examples the state goes first, so many
    questions on one state share it (the /v1/systemone and shared-state case)."""
    order = order or list(range(len(options)))
    shown = [options[i] for i in order]
    listing = "\n".join(f"- {o.id}: {o.description}" if o.description else f"- {o.id}" for o in shown)
    labels = [f" {o.id}\n" for o in shown]
    if not examples:
        marked = (text("Case:\n") + _SEGMENT + text(f"{state_text(state)}\n\n") + _SEGMENT
                  + text(f"{OPTION_WORDS_INSTRUCTION}\n\nQuestion: {question}\nOptions:\n{listing}\n\n"
                         "Answer for the case above.\nAnswer:"))
        return Prompt("option-words", PROMPT_VERSIONS["option-words-state-first"], split_marked(marked), labels,
                      False, order)
    solved = "".join(f"Case:\n{state_text(e.state)}\nAnswer: {e.option_id}\n\n" for e in examples)
    marked = (text(f"{OPTION_WORDS_INSTRUCTION}\n\nQuestion: {question}\nOptions:\n{listing}\n\n{solved}Case:\n")
              + _SEGMENT + text(f"{state_text(state)}\nAnswer:"))
    return Prompt("option-words", PROMPT_VERSIONS["option-words"], split_marked(marked), labels, False, order)


def rotations(n: int) -> list[list[int]]:
    """Cyclic option orders used by permutation averaging: each option visits every position once."""
    return [[(r + k) % n for k in range(n)] for r in range(n)]
