"""`python -m app check`: a policy's numbers against the bounds a pull request must keep (no
Streamlit) - the measured values, one verdict per threshold, JUnit XML for CI and Markdown for a
pull-request comment.

Exit codes (CI reads them): 0 every threshold holds, 1 at least one fails, 2 a usage or target error
(bad arguments, an unknown policy/set/run, a target that failed on some rows) - nothing was judged.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.core.drift import Drift
from app.core.calibration import BOUND_NAME, cp_lower
from app.core.gates import GateMetrics

EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


@dataclass
class Outcome:
    """One threshold: what was measured, the bound, and whether it holds."""
    name: str  # the flag, e.g. "min-accuracy"
    measured: float | None
    bound: float
    passed: bool
    message: str


@dataclass
class CheckReport:
    outcomes: list[Outcome]
    context: dict[str, Any] = field(default_factory=dict)  # policy, set, target, model, run, counts
    flipped_rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outcomes)

    @property
    def exit_code(self) -> int:
        return EXIT_PASS if self.passed else EXIT_FAIL


def _cell(text: Any) -> str:
    """User text in a Markdown table cell: no pipe or newline can break the table."""
    return str("" if text is None else text).replace("|", "\\|").replace("\n", " ")


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _lower(name: str, what: str, measured: float | None, bound: float, detail: str) -> Outcome:
    ok = measured is not None and measured >= bound
    return Outcome(name, measured, bound, ok, f"{what} {_pct(measured)} {'>=' if ok else '<'} bound {_pct(bound)} "
                   f"({detail})")


def evaluate(metrics: GateMetrics, bounds: dict[str, float | None], drift: Drift | None = None) -> list[Outcome]:
    """An outcome for each bound given (None = not checked), in a fixed order."""
    out: list[Outcome] = []
    acc, cov, gacc = metrics.accuracy, metrics.coverage, metrics.gate_accuracy
    given = {k: float(v) for k, v in bounds.items() if v is not None}
    if "min_accuracy" in given:
        out.append(_lower("min-accuracy", "accuracy, all labeled rows", acc.rate, given["min_accuracy"],
                          f"{acc.k}/{acc.n}, 95% CI {_pct(acc.low)}-{_pct(acc.high)}"))
    if "min_gate_accuracy" in given:
        out.append(_lower("min-gate-accuracy", "accuracy of the rows the gate decides", gacc.rate,
                          given["min_gate_accuracy"], f"{gacc.k}/{gacc.n} decided labeled rows, 95% CI "
                          f"{_pct(gacc.low)}-{_pct(gacc.high)}; {BOUND_NAME} "
                          f"{_pct(cp_lower(gacc.k, gacc.n)) if gacc.n else 'n/a'}"))
    if "min_coverage" in given:
        out.append(_lower("min-coverage", "coverage (rows decided, not sent to the fallback)", cov.rate,
                          given["min_coverage"], f"{cov.k}/{cov.n} rows"))
    if "max_ece" in given:
        ece, bound = metrics.ece, given["max_ece"]
        ok = ece is not None and ece == ece and ece <= bound
        out.append(Outcome("max-ece", ece, bound, ok, f"ECE (10 equal-width bins, the confidence the gate reads) "
                           f"{'n/a' if ece is None else f'{ece:.3f}'} {'<=' if ok else '>'} bound {bound:.3f} "
                           f"({acc.n} labeled rows)"))
    if drift is not None:
        for flag, n, what in (("max_flips", drift.flips, "flips (top option changed)"),
                              ("max_broken", drift.counts["broken"], "broken rows (right before, wrong now)")):
            if flag in given:
                ok = n <= given[flag]
                out.append(Outcome(flag.replace("_", "-"), float(n), given[flag], ok,
                                   f"{what} against the baseline: {n} {'<=' if ok else '>'} bound {given[flag]:g} "
                                   f"(of {len(drift.pairs)} rows in common; fixed {drift.counts['fixed']}, broken "
                                   f"{drift.counts['broken']}, changed-wrong {drift.counts['changed-wrong']})"))
    return out


def junit_xml(report: CheckReport, suite: str) -> str:
    """One test case per threshold; a failed one carries the measured value and the bound as its
    failure message, a passed one as its system-out."""
    from junit_xml import TestCase, TestSuite, to_xml_report_string

    cases = []
    for o in report.outcomes:
        case = TestCase(o.name, classname=f"semif.check.{report.context.get('policy', 'policy')}",
                        stdout=o.message if o.passed else None)
        if not o.passed:
            case.add_failure_info(message=o.message, failure_type="threshold")
        cases.append(case)
    props = {k: str(v) for k, v in report.context.items() if isinstance(v, (str, int, float))}
    return str(to_xml_report_string([TestSuite(suite, cases, properties=props)]))


def markdown(report: CheckReport) -> str:
    """A pull-request comment: the verdict first, a table of thresholds, what was checked, the flips."""
    c = report.context
    head = "passed" if report.passed else "failed"
    failed = sum(not o.passed for o in report.outcomes)
    lines = [f"### SemIf check {head}: {_cell(c.get('policy'))} on {_cell(c.get('labeled_set'))} × {_cell(c.get('target'))}", "",
             f"{len(report.outcomes) - failed} of {len(report.outcomes)} thresholds hold." if report.outcomes
             else "No threshold was given: nothing was judged.", "",
             "| threshold | measured | bound | result |", "|---|---|---|---|"]
    for o in report.outcomes:
        as_rate = o.name.startswith("min-")
        measured = "n/a" if o.measured is None else (_pct(o.measured) if as_rate else f"{o.measured:.3g}")
        bound = _pct(o.bound) if as_rate else f"{o.bound:g}"
        lines.append(f"| `--{o.name}` | {measured} | {bound} | {'pass' if o.passed else '**FAIL**'} |")
    lines += ["", "<details><summary>What was checked</summary>", ""]
    lines += [f"- {k.replace('_', ' ')}: {_cell(v)}" for k, v in c.items()]
    lines += [f"- {o.name}: {o.message}" for o in report.outcomes]
    lines += ["", "</details>"]
    if report.flipped_rows:
        lines += ["", f"Rows whose top option changed against the baseline ({len(report.flipped_rows)}, first 20):", "",
                  "| row | label | baseline | now | kind |", "|---|---|---|---|---|"]
        lines += [f"| {_cell(r['row_key'])} | {_cell(r['label'])} | {_cell(r['a_top'])} | {_cell(r['b_top'])} | {r['kind']} |"
                  for r in report.flipped_rows[:20]]
    return "\n".join(lines) + "\n"
