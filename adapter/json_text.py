"""Strict JSON text, the one rule for every JSON the adapter reads - a request body, a JSONL line, a
policy file, a policy given as a value: `json.loads` with every way it can fail turned into a
ValueError carrying a position when known (deep nesting, 5,000-digit integers, NaN and Infinity), the
nesting counted without recursion, and the text rule: no lone UTF-16 surrogate anywhere (a
RequestError naming where - the server answers it as a field-named 422, a policy reader as a
PolicyError). Loads no web framework.

Why `gil_heavy`: `json.loads` is one C call that holds the GIL until it returns, and while one thread
holds the GIL the server's event loop cannot answer /ping (adapter/server/http_body.py caps how many
values a body may hold before it reaches here).
"""
from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from typing import Any, Iterator

from adapter.schema import Loc, RequestError


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (use null or a string)")


_HEAVY = threading.Lock()


@contextlib.contextmanager
def gil_heavy() -> Iterator[None]:
    """Around one long call that holds the GIL (json.loads of a whole body): one such call at a
    time, then - when it ran longer than a GIL switch interval - a millisecond's sleep while still
    holding the lane: the event loop thread, which has been waiting for the GIL, takes it and
    answers /ping before the next one starts."""
    with _HEAVY:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if time.perf_counter() - t0 > sys.getswitchinterval():  # long enough that the loop is waiting
                time.sleep(0.001)


def parse_json(body: bytes, max_depth: int) -> Any:
    """json.loads, with every way it can fail raised as ValueError carrying a position when known."""
    try:
        with gil_heavy():
            value = json.loads(body, parse_constant=_reject_constant)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise ValueError(f"JSON nested too deeply: at most {max_depth} levels") from None
    except UnicodeDecodeError:
        raise ValueError("the body is not UTF-8 text") from None
    except ValueError as exc:
        if "integer string conversion" in str(exc):
            raise ValueError("an integer has more than 4300 digits: send such numbers as strings") from None
        raise
    depth = nesting(value, max_depth)
    if depth > max_depth:
        raise ValueError(f"JSON nested {depth}+ levels deep: at most {max_depth} levels")
    bad = lone_surrogate(value)
    if bad is not None:
        raise RequestError(bad, SURROGATE_MSG, "string_unicode")
    return value


SURROGATE_MSG = ("holds a lone UTF-16 surrogate escape (\\ud800-\\udfff without its pair): that is not text and "
                 "cannot be encoded as UTF-8 - send the character itself, or a valid pair")


def lone_surrogate(value: Any) -> Loc | None:
    """The text rule of every body: the loc (path) of the first string - value or object key - that
    holds a lone surrogate, else None. JSON's \\uXXXX escapes can name half of a UTF-16 pair alone;
    Python keeps it, and UTF-8 (the tokenizer, the log, the answer) cannot encode it. Refused, not
    replaced: a replaced character would be scored as a different text than the client sent, silently.
    Iterative, like `nesting`."""
    stack: list[tuple[Any, Loc]] = [(value, [])]
    while stack:
        v, loc = stack.pop()
        if isinstance(v, str):
            if _has_surrogate(v):
                return loc
        elif isinstance(v, dict):
            for k, x in v.items():
                if _has_surrogate(k):
                    return [*loc, k.encode("utf-8", "backslashreplace").decode("ascii")]
                stack.append((x, [*loc, k]))
        elif isinstance(v, list):
            stack.extend((x, [*loc, i]) for i, x in enumerate(v))
    return None


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def nesting(value: Any, limit: int) -> int:
    """Depth of nested arrays/objects, counting stops past `limit` (iterative: no recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if deepest > limit:
                return deepest
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest
