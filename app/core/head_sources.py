"""Which (model, layout, head) to ship for a labeled policy: accuracy out of fold against cost a row.

An evaluation can read, beside its run, hidden states in the *head layout* (the policy first and
cached, the state last: adapter/prompt.render_policy_first) from the default model and from other
local models - one companion run each, scored row by row with it. Each source's calibration gives
candidates: the main run as scored (zero-shot), with its best correction and its best learned head,
and each companion's head. They are compared on the rows every one of them answered (paired), each
with its accuracy and macro-F1 out of fold (Wilson / bootstrap 95% intervals), the seconds and tokens a
row measured when its run was scored, and $ per 1,000 decisions on the instance a deployment uses.

The recommendation: the most accurate candidate, then the cheapest candidate that is not worse than it
beyond noise (the existing paired rule: the bootstrap interval of the gain above zero and McNemar p <
0.05 is "worse"). A candidate that could not be fitted is shown as refused, with why - never as 0%.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, TypedDict

import numpy as np

from adapter.schema import HEAD_LAYOUT
from deploy.config import DEFAULT_CPU_INSTANCE
from deploy.pricing import cost_per_1000

from app.core import calibration
from app.core.run_calibration import Calibration
from app.core.records import config_of
from app.core.stats import PairedGain, Proportion, bootstrap_ci, paired_gain, proportion
from app.core.stored import NO_RESPONSE, StoredResponse

MAX_MEASURED_LOSS = 0.05  # a cheaper candidate may be at most 5 points below the most accurate, as measured
LAYOUT_WORDS: dict[str, str] = {"state-first": "state first", HEAD_LAYOUT: "head layout (policy first)"}


@dataclass(frozen=True)
class Candidate:
    """One way to decide: a run's rows (model x layout) read as scored, corrected, or by a learned head."""

    run_id: int
    model: str
    layout: str
    method: str  # "zero-shot", a correction's name or a head's name
    kind: str  # "zero-shot" | "correction" | "head"
    right: Mapping[str, bool]  # row key -> decided right (out of fold for corrections and heads)
    predicted: Mapping[str, int]
    labels: Mapping[str, int]
    seconds: float | None  # median seconds a warm row took when its run was scored, on this machine
    tokens: float | None  # median tokens a row evaluated beyond the cached prefix
    refused: str = ""  # why this candidate has no numbers

    @property
    def name(self) -> str:
        return f"{self.model} · {LAYOUT_WORDS.get(self.layout, self.layout)} · {self.method}"

    @property
    def usd_per_1000(self) -> float | None:
        if not self.seconds:
            return None
        return usd_per_1000_rows(self.seconds)[0]


def usd_per_1000_rows(seconds: float) -> tuple[float | None, str]:
    """$ per 1,000 rows at `seconds` a row on the priced CPU instance (one fully busy instance), and how:
    the instance and deploy.pricing's rule with its price (bench.throughput prices its modes by it too)."""
    usd, how = cost_per_1000(DEFAULT_CPU_INSTANCE, 1 / seconds)
    return usd, f"{DEFAULT_CPU_INSTANCE}: {how}"


@dataclass(frozen=True)
class Row:
    """A candidate on the common rows: what the table and the chart show."""

    candidate: Candidate
    accuracy: Proportion | None
    macro_f1: float | None
    macro_f1_ci: tuple[float, float] | None
    gain_vs_best: PairedGain | None  # the best candidate against this one: beyond noise = this one is worse
    speedup: float | None  # seconds a row of the default's zero-shot / this candidate's


@dataclass(frozen=True)
class Table:
    rows: list[Row]
    n: int  # rows every candidate answered
    best: Row | None
    recommended: Row | None
    sentence: str


def warm_costs(results: Sequence[Mapping[str, Any]]) -> tuple[float | None, float | None]:
    """(median seconds, median tokens evaluated) a row of a run, warm rows only (a cold row paid for the
    model load and the policy's first passes): what a deployed decision of this source costs."""
    warm = [r for r in results if not r.get("error") and not r.get("cold")]
    secs = [float(r["latency_s"]) for r in warm if isinstance(r.get("latency_s"), (int, float))]
    toks = [t for r in warm if (t := (StoredResponse.of(r) or NO_RESPONSE).evaluated_tokens) is not None]
    return (statistics.median(secs) if secs else None), (statistics.median(toks) if toks else None)


def run_candidates(cal: Calibration, run: Mapping[str, Any]) -> list[Candidate]:
    """A run's candidates: as scored, its best correction and its best head (a head-layout run: only its head)."""
    layout = config_of(run).get("layout") or "state-first"
    model = _model(cal)
    keys = [str(r["row_key"]) for r in cal.results]
    labels = dict(zip(keys, (int(v) for v in cal.y)))
    seconds, tokens = warm_costs(cal.results)

    def make(method: str, kind: str, P: np.ndarray | None, refused: str = "") -> Candidate:
        pred = {} if P is None else dict(zip(keys, (int(v) for v in calibration.predictions(P))))
        right = {k: pred[k] == labels[k] for k in pred}
        return Candidate(cal.run_id, model, layout, method, kind, right, pred, labels, seconds, tokens, refused)

    out = []
    if layout != HEAD_LAYOUT:
        out.append(make("zero-shot", "zero-shot", cal.P))
        out.append(make(cal.correction.name, "correction", cal.correction.oof))
    usable = [f for f in cal.heads if f.available and f.oof is not None]
    if layout == HEAD_LAYOUT:
        usable = [f for f in usable if f.kind != "linc"]
    if usable:
        best = max(usable, key=lambda f: (round(f.oof_accuracy, 12), -f.oof_nll))
        out.append(make(best.name, "head", best.oof))
    else:
        why = "; ".join(f.note for f in cal.heads if f.note) or "no head was fitted"
        out.append(make("learned head", "head", None, refused=why))
    return out


def _model(cal: Calibration) -> str:
    for r in cal.results:
        file = (StoredResponse.of(r) or NO_RESPONSE).model_file
        if file:
            return file
    return "?"


def compare(candidates: Sequence[Candidate], *, seed: int = 0) -> Table:
    """The candidates on the rows they all answered, the most accurate, and the recommendation."""
    live = [c for c in candidates if not c.refused]
    common = sorted(set.intersection(*(set(c.right) for c in live))) if live else []
    n = len(common)
    k = 1 + max((v for c in live for d in (c.labels, c.predicted) for v in d.values()), default=0)
    base = next((c for c in live if c.kind == "zero-shot" and c.layout != HEAD_LAYOUT), None)

    def right_of(c: Candidate) -> np.ndarray:
        return np.array([c.right[key] for key in common], bool)

    stats: dict[int, tuple[Proportion, float, tuple[float, float] | None]] = {}
    for i, c in enumerate(candidates):
        if c.refused or not n:
            continue
        y = np.array([c.labels[key] for key in common])
        pred = np.array([c.predicted[key] for key in common])
        f1 = calibration.macro_f1(y, pred, k)
        ci = bootstrap_ci(np.arange(n), _f1_of(y, pred, k), seed=seed, n_resamples=400)
        stats[i] = (proportion(int(right_of(c).sum()), n), f1, ci)
    best_i = max(stats, key=lambda i: (stats[i][0].k, -(candidates[i].seconds or math.inf)), default=None)
    rows: list[Row] = []
    for i, c in enumerate(candidates):
        if i not in stats:
            rows.append(Row(c, None, None, None, None, None))
            continue
        gain = None if best_i is None or i == best_i else paired_gain(right_of(c), right_of(candidates[best_i]), seed=seed)
        speed = (base.seconds / c.seconds) if base is not None and base.seconds and c.seconds else None
        rows.append(Row(c, stats[i][0], stats[i][1], stats[i][2], gain, speed))
    best = rows[best_i] if best_i is not None else None
    status_quo = next((r.accuracy.rate for r in rows if r.candidate is base and r.accuracy is not None), None)
    fine = [r for r in rows if r is best or acceptable(r, best, status_quo)]
    priced = [r for r in fine if r.candidate.seconds]
    recommended = min(priced, key=lambda r: (r.candidate.seconds, -(r.accuracy.k if r.accuracy else 0))) if priced else best
    cheaper = [r for r in rows if r not in fine and r.accuracy is not None and r.gain_vs_best is not None
               and not r.gain_vs_best.beyond_noise and recommended is not None and r.candidate.seconds
               and recommended.candidate.seconds and r.candidate.seconds < recommended.candidate.seconds]
    return Table(rows, n, best, recommended, sentence(recommended, best, base, n, cheaper))


def acceptable(r: Row, best: Row | None, status_quo: float | None) -> bool:
    """May this candidate stand in for the most accurate? Not worse beyond noise (the paired rule), no more
    than MAX_MEASURED_LOSS below it as measured, and not below the default model's zero-shot (today's
    decision) as measured. The first alone is not enough on a few dozen rows: 40 rows of incident
    priority called a 22.5-point loss 'within noise' (McNemar p 0.06) and recommended a test fixture."""
    mine = r.accuracy.rate if r.accuracy is not None else None
    top = best.accuracy.rate if best is not None and best.accuracy is not None else None
    if mine is None or top is None or r.gain_vs_best is None:
        return False
    if r.gain_vs_best.beyond_noise or top - mine > MAX_MEASURED_LOSS + 1e-9:
        return False
    return status_quo is None or mine >= status_quo - 1e-9


def _f1_of(y: np.ndarray, pred: np.ndarray, k: int) -> Callable[[np.ndarray], float]:
    return lambda idx: calibration.macro_f1(y[idx], pred[idx], k)


def sentence(rec: Row | None, best: Row | None, base: Candidate | None, n: int, cheaper: Sequence[Row] = ()) -> str:
    """'Recommended: Qwen 0.5B, head layout, hidden-state head: 71.0% (…) on 128 rows, 6.1× cheaper a row than
    the default's zero-shot, not worse than the most accurate beyond noise.' - and the cheaper candidates
    left out because they measured more than MAX_MEASURED_LOSS lower, so more rows would tell."""
    if rec is None or rec.accuracy is None:
        return "No candidate has numbers yet: evaluate the policy on a labeled set first."
    cost = ""
    if rec.speedup is not None and base is not None and rec.candidate is not base and abs(rec.speedup - 1) >= 0.05:
        cost = (f", {rec.speedup:.1f}× cheaper a row than {base.model} zero-shot" if rec.speedup >= 1 else
                f", {1 / rec.speedup:.1f}× dearer a row than {base.model} zero-shot")
    out = f"Recommended: {rec.candidate.name}: {rec.accuracy.text()} out of fold on {n} rows{cost}"
    if best is None or rec is best:
        out += " - the most accurate candidate" + (" and the cheapest such." if rec is best else ".")
    else:
        assert best.accuracy is not None
        gain = rec.gain_vs_best.text() if rec.gain_vs_best is not None else ""
        out += (f", not worse than the most accurate ({best.candidate.name}, {best.accuracy.rate:.1%}) beyond noise "
                f"and at most {MAX_MEASURED_LOSS:.0%} below it as measured (its gain {gain}).")
    if cheaper:
        names = "; ".join(f"{r.candidate.name} ({r.accuracy.rate:.1%})" for r in cheaper if r.accuracy is not None)
        out += (f" Cheaper and within noise, but more than {MAX_MEASURED_LOSS * 100:.0f} points below the most accurate "
                f"(or below today's zero-shot) as measured, so not recommended: {names} - label more rows to tell "
                "whether the loss is real.")
    return out


class ChartRow(TypedDict):
    """A candidate with numbers, as the cost chart plots it (read by key into a frame)."""
    label: str
    rate: float | None
    low: float | None
    high: float | None
    seconds: float | None
    recommended: bool


def chart_rows(table: Table) -> list[ChartRow]:
    """{label, rate, low, high, seconds, recommended} per candidate with numbers, for the cost chart."""
    return [{"label": f"{r.candidate.model.removesuffix('.gguf')} · {r.candidate.method}"
             + (" (head layout)" if r.candidate.layout == HEAD_LAYOUT else ""),
             "rate": r.accuracy.rate, "low": r.accuracy.low, "high": r.accuracy.high,
             "seconds": r.candidate.seconds, "recommended": r is table.recommended}
            for r in table.rows if r.accuracy is not None]


def table_rows(table: Table) -> list[dict[str, Any]]:
    """The comparison as rows for a table and a CSV download."""
    out = []
    for r in table.rows:
        c = r.candidate
        out.append({  # accuracy and cost first: what the choice is about, on screen without scrolling
            "source": f"{c.model.removesuffix('.gguf')} · {c.method}",
            "accuracy (out of fold)": None if r.accuracy is None else r.accuracy.rate,
            "accuracy 95% CI": "" if r.accuracy is None else f"{r.accuracy.low:.1%}–{r.accuracy.high:.1%}",
            "s a row (measured)": c.seconds,
            f"$ per 1,000 ({DEFAULT_CPU_INSTANCE})": c.usd_per_1000,
            "speed-up vs zero-shot": r.speedup,
            "tokens a row": c.tokens,
            "recommended": r is table.recommended,
            "vs the most accurate": ("most accurate" if r is table.best else "" if r.gain_vs_best is None else
                                     ("worse beyond noise" if r.gain_vs_best.beyond_noise else "within noise")),
            "macro-F1": r.macro_f1,
            "macro-F1 95% CI": "" if r.macro_f1_ci is None else f"{r.macro_f1_ci[0]:.2f}–{r.macro_f1_ci[1]:.2f}",
            "rows": table.n if r.accuracy is not None else 0,
            "run": c.run_id, "model": c.model, "layout": LAYOUT_WORDS.get(c.layout, c.layout), "method": c.method,
            "refused": c.refused,
        })
    return out
