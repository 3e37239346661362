"""The workbench's actions, one function per thing a user does - no Streamlit, typed inputs and results.

Pages (app/pages) and the command line (app/cli) only collect input and show what these return; the
rules behind them (scoring, gating, pricing, planning) live here and in app/core, once:

- policies.py   resolve, seed the templates, add a template or a copy (never over an existing id)
- sets.py       labeled sets: resolve, import (shipped or uploaded), what a set supports
- targets.py    targets by name, built, tested, added through the kind registry
- decide.py     run a policy (Playground), compare targets, the latency benchmark
- checks.py     the order check and the robustness check
- heads.py      saved calibrated policies with a learned head, picked for Robustness and Compare
- evaluate.py   evaluate on a labeled set, calibrate, export a calibrated policy
- deploy.py     plan, apply, destroy (recorded in the store)
- drift.py      two runs side by side
- ci_check.py   `python -m app check`: thresholds, JUnit, Markdown
- production.py decision logs imported as runs, replayed on a target
- review.py     the review queue and its new set versions
- inputs.py     a command's inputs (policy, set or states, calibrated policies, targets) resolved once: Inputs
- queries.py    the read-only queries pages make of the store (one store call each)
"""
