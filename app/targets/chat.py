"""OpenAI-compatible chat completions (text generation): the letters prompt as messages, the
generated answer parsed back to an option; probabilities from the first token's top logprobs when
the server returns them, else one-hot (marked `generated-one-hot`)."""
from __future__ import annotations

import math
import re
from typing import Any

from adapter.engine.prompt import LETTERS, letters_messages
from adapter.schema import DecisionRequest, DecisionResult, ProbabilityStatus

from app.targets.base import KeyedTarget, TargetError, http_json

def parse_chat_answer(text: str, req: DecisionRequest) -> int | None:
    """The option a generated answer names: a letter (A, 'B.', '(C)', 'Answer: D') or an option id."""
    n = len(req.options)
    t = (text or "").strip()
    m = re.match(r"^\W*(?:(?:the\s+)?answer(?:\s+is)?\s*[:\-]?\s*)?\(?([A-Z])(?:$|[.):,\n]|\s*$)", t, flags=re.I)
    if m and m.group(1).upper() in LETTERS[:n]:
        return LETTERS.index(m.group(1).upper())
    ids = [o.id.lower() for o in req.options]
    found = [i for i, oid in enumerate(ids) if re.search(rf"(?<!\w){re.escape(oid)}(?!\w)", t.lower())]
    return found[0] if len(found) == 1 else None


def chat_url(url: str) -> str:
    """A base URL (http://host:8080, .../v1) or the full chat-completions URL -> the full URL."""
    url = url.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    return url + ("/chat/completions" if url.endswith("/v1") else "/v1/chat/completions")


class ChatTarget(KeyedTarget):
    """Generated answers: probabilities come from top logprobs of the first answer token when the
    server returns them, else the parsed option gets 1.0 (marked `generated-one-hot`)."""

    def __init__(self, name: str, config: dict, secrets: dict | None = None):
        super().__init__(name, "chat", config, secrets)
        self.url = chat_url(config["url"])
        self.model = config.get("model") or "default"
        self.max_tokens = int(config.get("max_tokens", 4))

    def _one(self, req):
        body = chat_body(req, self.model, self.max_tokens)
        data = http_json("POST", self.url, body=body, headers=self.auth(), timeout=float(self.config.get("timeout", 120)))
        return body, data, chat_result(req, data)

    def test_connection(self) -> str:
        base = self.url.rsplit("/chat/completions", 1)[0]
        data = http_json("GET", base + "/models", headers=self.auth(), timeout=5)
        models = [m.get("id") for m in data.get("data", [])]
        return f"{base} is up; models: {', '.join(map(str, models)) or 'none listed'}"


def chat_body(req: DecisionRequest, model: str, max_tokens: int = 4) -> dict:
    """The letters prompt as chat messages: the same text the local letters readout reads."""
    return {"model": model, "messages": letters_messages(req.state, req.question, req.options),
            "max_tokens": max_tokens, "temperature": 0, "logprobs": True, "top_logprobs": 20}


def chat_result(req: DecisionRequest, data: Any) -> DecisionResult:
    """A chat completion parsed back to the decision shape; TargetError when it names no option."""
    try:
        choice = data["choices"][0]
        text = choice["message"]["content"] or ""
    except (KeyError, IndexError, TypeError):
        raise TargetError(f"not a chat completion response: {str(data)[:200]}") from None
    picked = parse_chat_answer(text, req)
    if picked is None:
        raise TargetError(f"unparseable answer: {text[:80]!r} names no single option", data)
    ids = [o.id for o in req.options]
    probs, status = _probs_from_logprobs(choice.get("logprobs"), len(ids))
    if probs is None or int(max(range(len(ids)), key=probs.__getitem__)) != picked:
        probs, status = [1.0 if i == picked else 0.0 for i in range(len(ids))], "generated-one-hot"
    return DecisionResult(id=req.id, option_ids=ids, probabilities=probs, top_option=ids[picked],
                          probability_status=status, generated_text=text, readout="chat-generation",
                          usage=data.get("usage"))


def _probs_from_logprobs(logprobs: dict | None, n: int) -> tuple[list[float] | None, ProbabilityStatus]:
    """Letter distribution from the first generated token's top logprobs, renormalised."""
    try:
        top = logprobs["content"][0]["top_logprobs"]  # type: ignore[index]
    except (TypeError, KeyError, IndexError):
        return None, "generated-logprobs"
    mass = [0.0] * n
    for item in top:
        tok = (item.get("token") or "").strip().upper()
        if len(tok) == 1 and tok in LETTERS[:n]:
            mass[LETTERS.index(tok)] += math.exp(item["logprob"])
    total = sum(mass)
    if total <= 0:
        return None, "generated-logprobs"
    return [m / total for m in mass], "generated-logprobs"


