"""The Robustness check (no Streamlit): does a decision hold when the input changes in ways that
should not matter - or in the ways a customer who wants a particular outcome would change it?

Metamorphic changes, each scored on the same target as the unchanged row ("base"):

- steering: a sentence that names a wrong option (by id, or by its description) is added to the
  state - at the end, the start or in the middle. Hijack rate = share of attempts whose decision
  moves to the named option; still-correct rate = share still decided as labeled. With the
  steering guard on, an attempt is *held* when it is decided correctly or flagged.
- paraphrase (the question reworded) and rename (the options reworded): flip rate = share of
  states whose top option changes.
- irrelevant option: an off-topic option is added; does the top option change?
- none of these: a "none of the listed options" option is added; how much probability it takes
  on in-scope states vs states that fit no option (AUC: does it tell them apart?).
- order (every option in every position) and, for yes/no policies, a negated question.

Rows of a run are keyed `<state key>#rb:<check>:<variant>`, so the stored results can be
regrouped; `analyse()` turns them into rates with Wilson 95% intervals and a verdict per risk.

suite.py   what is changed: the checks, steering templates, the shipped suite and the analyst's additions
plan.py    the rows scored for each state, and the run that holds them
analyse.py the results read back, one function (and verdict) per check
report.py  what the report holds, typed: one frozen dataclass per part, a rate a stats.Proportion
"""
from app.core.robustness.analyse import (FLIP_CHECKS, HIJACK_WORRY, Report, analyse, flip_rates, flip_verdict,
                                        negation_sums, negation_verdict, none_of_these, none_verdict, report_for,
                                        steering_attempts, steering_verdict)
from app.core.robustness.plan import (SEP, calls_per_state, key, named_text, plan_items, renamed_policy, split_key,
                                     start_check, steer, steering_combos)
from app.core.robustness.report import Summary
from app.core.robustness.suite import (CHECK_LABELS, CHECKS, GENERIC_IRRELEVANT, NONE_OPTION, PLACEMENTS,
                                      ROBUSTNESS_DIR, Placement, Suite, SuiteError, Template, check_suite, families,
                                      interleaved, parse_templates, shipped_suite)
from app.core.order_sensitivity import FLIP_WORRY
from app.core.runner import Case

__all__ = ["CHECKS", "CHECK_LABELS", "FLIP_CHECKS", "FLIP_WORRY", "GENERIC_IRRELEVANT", "HIJACK_WORRY", "NONE_OPTION",
           "PLACEMENTS", "ROBUSTNESS_DIR", "SEP", "Case", "Placement", "Report", "Suite", "Summary", "SuiteError", "Template",
           "analyse", "calls_per_state", "check_suite", "families", "interleaved", "flip_rates", "flip_verdict", "key", "named_text",
           "negation_sums", "negation_verdict", "none_of_these", "none_verdict", "parse_templates", "plan_items",
           "renamed_policy", "report_for", "shipped_suite", "split_key", "start_check", "steer", "steering_attempts",
           "steering_combos", "steering_verdict"]
