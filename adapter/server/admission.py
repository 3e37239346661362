"""How much work the adapter takes on, and when it stops: a bounded queue, a per-request budget.

- `Admission`: at most `max_queue` requests waiting for or holding the engine; the next one gets a
  429 with `Retry-After` (estimated from recent service times) instead of an ever longer wait.
- `RequestBudget`: a deadline (SM_SEMIF_REQUEST_TIMEOUT, SageMaker's own 60 s by default) plus a
  cancel switch (client gone, shutting down). A request is admitted and its clock started before
  its body is read, decoded, parsed or validated: all of that is within the budget. The engine calls `check()` between forward passes
  and llama.cpp's abort callback asks `should_stop()` during one, so a request stops within
  milliseconds of its deadline or cancellation.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass


FORECAST_SLACK = 1.0  # the forecast is conservative for long prompts (measured: 65 s forecast, 82 s needed)


class Stopped(Exception):
    """Work stopped early: `status` and `error_type` say why for the HTTP answer."""

    def __init__(self, status: int, error_type: str, message: str):
        super().__init__(message)
        self.status, self.error_type, self.message = status, error_type, message


class Pace:
    """Tokens per second this process's engine evaluated, measured on finished requests' own work (a
    moving average: under load it falls, and the forecast with it). Unknown until MIN_SAMPLES requests of
    at least MIN_TOKENS tokens each finished."""

    # measured on requests large enough that a request's fixed costs (~130 ms of set-up, label reads) do not
    # dominate, and applied to those alone: a small request is never refused on an estimate
    MIN_SAMPLES, MIN_TOKENS, MIN_FORECAST = 2, 256, 512

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rate: float | None = None
        self.samples = 0

    def record(self, tokens: int, seconds: float | None) -> None:
        if tokens < self.MIN_TOKENS or not seconds or seconds <= 0:
            return
        with self._lock:
            r = tokens / seconds
            self.rate = r if self.rate is None else 0.7 * self.rate + 0.3 * r
            self.samples += 1

    def seconds_for(self, tokens: int) -> float | None:
        if self.rate is None or self.samples < self.MIN_SAMPLES or tokens < self.MIN_FORECAST:
            return None
        return tokens / self.rate


@dataclass(eq=False)  # identity: budgets live in a set
class RequestBudget:
    timeout: float
    pace: Pace | None = None  # the process's measured pace: with it, a request that cannot finish is refused at once
    started: float = 0.0
    working: bool = False  # doing this request's own work (parsing, scoring): a deadline now is its own cost
    served: float | None = None  # seconds the engine worked for it (for Retry-After estimates)
    planned: int = 0  # tokens the engine said this request's work evaluates (an estimate: cache hits vary)
    done: int = 0  # tokens evaluated so far
    forecast_tokens: int | None = None  # what the engine forecast before the work (forecast)
    _reason: Stopped | None = None
    _after_policy: Stopped | None = None  # refused, once the policy's cacheable work is done and kept (forecast)

    def __post_init__(self) -> None:
        self.started = self.started or time.monotonic()

    def remaining(self) -> float:
        return self.timeout - (time.monotonic() - self.started)

    def cancel(self, status: int, error_type: str, message: str) -> None:
        if self._reason is None:
            self._reason = Stopped(status, error_type, message)

    def count_tokens(self, *, planned: int = 0, done: int = 0) -> None:
        """The engine's running count of the work (engine._count), for the deadline's message only:
        nothing is refused on an estimate; a request stops when its deadline has really passed."""
        self.planned += planned
        self.done += done

    def forecast(self, tokens: int, cacheable: int = 0) -> None:
        """Before the engine starts this request's work: refuse it now when the tokens it plans, at the pace
        this process measured, need more time than its deadline leaves - instead of 60 s of work that ends in
        the same refusal and delays every request behind it. Only with a measured pace (from requests large
        enough, and for requests large enough: Pace). A request that would fit a whole deadline but not what
        is left of it after queueing gets 503 (load: worth a retry), one that would not fit even a whole
        deadline 413 (a retry costs the same again).

        `cacheable`: the part of `tokens` that is the policy's own work, kept once done (its content-free
        prior: 3 passes per policy and option order). A request refused for time must not be refused forever,
        so when that part fits the time left, and the rows alone would fit a whole deadline, the engine does
        the policy's work first (kept for every later request of the policy) and the request is then refused
        with 503 (after_policy_work): its retry plans only its rows. Without this, a valid 26-option
        content-free choice under sustained load was refused on every attempt, nothing ever cached."""
        self.forecast_tokens = tokens
        need = self.pace.seconds_for(tokens) if self.pace is not None else None
        left = self.remaining()
        if need is None or self.pace is None or need <= FORECAST_SLACK * left:
            return
        assert self.pace.rate is not None
        elapsed = time.monotonic() - self.started
        how = (f"stopped after {elapsed:.1f} s, before any work: about {need:.0f} s needed for its {tokens:,} tokens at "
               f"this server's measured pace of {self.pace.rate:.0f} tokens/s")
        policy_s, rows_s = cacheable / self.pace.rate, (tokens - cacheable) / self.pace.rate
        if 0 < cacheable and policy_s <= FORECAST_SLACK * left and rows_s <= FORECAST_SLACK * self.timeout:
            self._after_policy = Stopped(
                503, "overloaded", f"the request's {tokens:,} tokens need about {need:.0f} s at this server's measured "
                f"pace of {self.pace.rate:.0f} tokens/s, more than the {max(left, 0):.0f} s left of "
                f"SM_SEMIF_REQUEST_TIMEOUT={self.timeout:g} s: the policy's own work ({cacheable:,} tokens, its "
                f"content-free prior) was done and is kept, so a retry needs only its rows ({tokens - cacheable:,} "
                "tokens) - retry after the Retry-After seconds")
            return
        if need <= FORECAST_SLACK * self.timeout:  # it would fit a whole deadline: the wait behind others is the cause
            raise Stopped(503, "overloaded", f"the request waited behind other requests and the {max(left, 0):.0f} s left "
                          f"of SM_SEMIF_REQUEST_TIMEOUT={self.timeout:g} s are too few ({how}): retry after the "
                          "Retry-After seconds")
        raise Stopped(413, "deadline_exceeded",
                      f"the request needs more than {self.timeout:g} s of compute (SM_SEMIF_REQUEST_TIMEOUT="
                      f"{self.timeout:g} s; {how}): send fewer rows, options or permutations per request, or a shorter "
                      "state (a server whose callers wait longer may raise the limit; a less loaded one is faster)")

    def after_policy_work(self) -> None:
        """Called by the engine once the policy's cacheable work is done: raise the refusal forecast kept
        for this moment (the rows' own work does not fit), else nothing."""
        if self._after_policy is not None:
            raise self._after_policy

    def overrun(self) -> str:
        """How far past the deadline the request's own work would run: elapsed seconds and tokens
        evaluated of those planned, and the total this machine's pace implies."""
        elapsed = time.monotonic() - self.started
        if self.planned <= 0:
            return f"stopped after {elapsed:.1f} s"
        if self.done <= 0:
            return f"stopped after {elapsed:.1f} s with none of {self.planned:,} tokens evaluated"
        need = elapsed * max(self.planned, self.done) / self.done
        return (f"stopped after {elapsed:.1f} s with {self.done:,} of about {self.planned:,} tokens evaluated: "
                f"about {need:.0f} s needed at this machine's pace, {need / self.timeout:.1f}x the limit")

    def should_stop(self) -> bool:
        return self._reason is not None or self.remaining() <= 0

    def check(self) -> None:
        """Raise why the work must stop. A deadline passed while queued is the server's load (503,
        worth a retry); passed during the request's own work, the request is too big for the
        deadline (413: a retry would cost the same again, so clients must not retry it)."""
        if self._reason is not None:
            raise self._reason
        if self.remaining() <= 0:
            if not self.working:
                raise Stopped(503, "overloaded", f"waited {self.timeout:g} s (SM_SEMIF_REQUEST_TIMEOUT) for the engine "
                              "behind other requests: retry after the Retry-After seconds")
            raise Stopped(413, "deadline_exceeded",
                          f"the request needs more than {self.timeout:g} s of compute (SM_SEMIF_REQUEST_TIMEOUT="
                          f"{self.timeout:g} s; {self.overrun()}): send fewer rows, options or permutations per "
                          "request, or a shorter state (a server whose callers wait longer may raise the limit)")


class Admission:
    """A counter of requests in the adapter, with the queue bound and the in-flight budgets (so a
    shutdown can cancel them)."""

    def __init__(self, max_queue: int):
        self.max_queue = max_queue
        self._lock = threading.Lock()
        self._active: set[RequestBudget] = set()
        self._service = 1.0  # moving average of seconds per request, for Retry-After
        self.pace = Pace()  # tokens/s of the engine's work, for refusing early (RequestBudget.forecast)
        self.draining = False

    def __len__(self) -> int:
        return len(self._active)

    def enter(self, budget: RequestBudget) -> None:
        with self._lock:
            if self.draining:
                raise Stopped(503, "shutting_down", "the adapter is shutting down: retry on another instance")
            if len(self._active) >= self.max_queue:
                raise Stopped(429, "queue_full", f"{len(self._active)} requests are already queued (SM_SEMIF_MAX_QUEUE="
                              f"{self.max_queue}): retry after the Retry-After seconds")
            self._active.add(budget)

    def leave(self, budget: RequestBudget, seconds: float | None) -> None:
        """`seconds`: how long the engine worked for it (None when it never got there: a refused
        body does not shorten the Retry-After estimate)."""
        with self._lock:
            self._active.discard(budget)
            if seconds is not None:
                self._service = 0.8 * self._service + 0.2 * seconds
        self.pace.record(budget.done, seconds)

    def retry_after(self) -> int:
        return max(1, math.ceil(self._service * max(1, len(self._active))))

    def cancel_all(self, status: int, error_type: str, message: str) -> int:
        with self._lock:
            for b in self._active:
                b.cancel(status, error_type, message)
            return len(self._active)
