"""`python -m adapter serve` with a test-only slow scorer: a controlled delay instead of a long state.

Run as `python -m tests.slow_adapter serve --port 0` (the same arguments as the adapter). Everything is the
real adapter - process, admission, engine lock, model - except two hooks, both printed to stdout so a test
waits for events instead of guessing durations:

- a row whose id starts with `hold` holds the engine (inside `Engine.score_many`, the lock taken) until its
  request is stopped - its client gone, the process draining, or its deadline - polling `budget.check()`
  as the real scorer does between forward passes: `HOLDING <id>`, then `RELEASED <id> <error_type>`;
- a row whose id starts with `expire` has its deadline pass inside a forward pass: the first time llama.cpp's
  abort callback asks its budget `should_stop()`, the deadline is moved into the past (`EXPIRED <id>`), so the
  real abort path stops the pass on any machine, however fast;
- each admitted request prints `ADMITTED <n>` (n: requests now in flight).

Why: a long state held the engine for a time that depends on the machine (and on the pace the adapter
measured: a quiet machine refused it at once as too long), so a test built on it passed or failed by speed.
"""
from __future__ import annotations

import sys
import time
from typing import Any

from adapter.__main__ import main
from adapter.engine.engine import Engine
from adapter.server.admission import Admission, RequestBudget, Stopped

HOLD, EXPIRE = "hold", "expire"
_score_many = Engine.score_many
_enter = Admission.enter
_should_stop = RequestBudget.should_stop
_expiring: dict[int, str] = {}  # id(budget) -> the `expire` row whose deadline passes in the next forward pass


def say(line: str) -> None:
    print(line, flush=True)


def score_many(self: Engine, rows: list[Any], *args: Any, **kwargs: Any) -> Any:
    held = [r.id for r in rows if r.id.startswith(HOLD)]
    budget = kwargs.get("budget")
    expiring = [r.id for r in rows if r.id.startswith(EXPIRE)]
    if expiring and budget is not None:
        _expiring[id(budget)] = expiring[0]
    if held and budget is not None:
        say(f"HOLDING {held[0]}")
        try:
            while True:
                budget.check()
                time.sleep(0.01)
        except Stopped as stop:
            say(f"RELEASED {held[0]} {stop.error_type}")
            raise
    return _score_many(self, rows, *args, **kwargs)


def should_stop(self: RequestBudget) -> bool:
    """Asked only by llama.cpp's abort callback, inside a forward pass."""
    row = _expiring.pop(id(self), None)
    if row is not None:
        self.started -= self.timeout  # the deadline has now passed, mid-pass
        say(f"EXPIRED {row}")
    return _should_stop(self)


def enter(self: Admission, budget: RequestBudget) -> None:
    _enter(self, budget)
    say(f"ADMITTED {len(self)}")


Engine.score_many = score_many  # type: ignore[method-assign]
Admission.enter = enter  # type: ignore[method-assign]
RequestBudget.should_stop = should_stop  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
