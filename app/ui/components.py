"""Streamlit display pieces shared by pages: a run group's results, pickers, downloads, glossary."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence, TypeVar

import json
from dataclasses import dataclass

import pandas as pd
import streamlit as st

from app.service import checks, decide, heads, policies as policy_service, queries, sets as set_service
from app.ui import charts, context, resources
from app.ui.safe_text import csv_safe, md
from app.core.records import Policy, Run
from app.core.store import Store

P = TypeVar("P", bound=Mapping[str, Any])  # a policy record or template: the picker hands back what it was given

def calibrated_picker(db: Store, policy: Mapping[str, Any], key: str, note: str = "") -> heads.AsDeployed | None:
    """A saved calibrated policy of this policy, tested as deployed - its readout, correction or head,
    guard, gate and fallback (none by default, or the calibrated policy in the page's context)."""
    saved = heads.calibrated_of(db, policy["id"])
    options: list[int | None] = [None, *saved]
    if key not in st.session_state:  # only on first sight: the picker is the analyst's after
        context.follow(key, "calibrated", list(saved))
    cid = st.selectbox("Calibrated policy (tested as deployed)", options, key=key,
                       format_func=lambda i: "none: the model alone" if i is None else saved[i],
                       help="a calibrated policy of this policy (Calibrate): the check then renders the rows as it "
                            "does and reads its correction or learned head, its guard, its gate and its fallback - "
                            "what Deploy ships")
    if not saved:
        st.caption("No calibrated policy of this policy yet: save one on Calibrate to test it as deployed.")
        return None
    if cid is None:
        return None
    try:
        pick = heads.as_deployed(db, cid)
    except ValueError as exc:
        st.error(f"**Calibrated policy**: {md(exc)}")
        return None
    st.caption(f"As deployed: {md(pick.describe())}. {note}".rstrip())
    return pick


GLOSSARY = {
    "label mass": "share of the model's next-token probability that went to the option labels at all; low means "
                  "the model was not really answering this question",
    "accuracy": "share of labeled rows whose top option is the label",
    "macro-F1": "F1 score averaged over options, so a rare option counts as much as a common one (1 is best)",
    "Brier": "mean squared distance between the probabilities and the one-hot label (0 best, 2 worst)",
    "NLL": "negative log-likelihood of the label: how surprised the model is by the right answer (lower is better)",
    "ECE": "expected calibration error: the average gap between confidence and accuracy over confidence bins",
    "ece_corrected": "ECE after the exported correction (temperature, temperature + fitted offsets, or a learned head), out of fold "
                     "(each row corrected by a fit that never saw it); the table's correction column names it",
    "temperature": "T that flattens (T > 1) or sharpens (T < 1) the probabilities to match observed accuracy",
    "fitted offsets": "one number per option added to log p / T, fitted on the labeled rows: unlike a temperature it "
                      "can change which option wins (a model that calls too much spam gets spam pulled down)",
    "learned head": "a logistic regression fitted on the labeled rows: on the option log-probs (LinC), on the "
                    "model's hidden state at the prompt's last token, or on both (stacked); with 'auto' exported only "
                    "when it beats the corrections beyond noise (or when you pick one by hand), and then applied by "
                    "the adapter to every row",
    "out of fold": "each row predicted by a fit that never saw it (5 stratified folds): the honest estimate of what a "
                   "fitted correction or head does on new rows",
    "letters": "readout: options lettered A..Z through the model's chat template; the letter logits are read",
    "option-words": "readout: a completion prompt that lists option ids; the first token(s) of each id are read",
    "content-free": "debias: divide out the answer the model gives to an empty state (its position bias)",
    "permutation": "debias: average the probabilities over every cyclic order of the options",
    "p50_vs_first": "median latency relative to the first target in the comparison",
    "warm": "calls after a target's first call on the policy in this workbench process (the first one computes "
            "the policy's first pass and content-free prior, opens connections; a local model's load is not timed)",
}


def glossary(*terms: str) -> None:
    """One-line explanations of the terms a view shows."""
    with st.expander("What do these numbers mean?"):
        for t in terms:
            st.markdown(f"- **{t}**: {GLOSSARY[t]}")


def show_group_results(db: Store, group_id: str, key: str) -> None:
    """A playground run group: which option each target chose (readable at any width), all
    probabilities side by side in one chart, latency in context, what the saved calibrated policy
    would do, and per target the raw request/response and a copyable cURL / boto3 snippet."""
    shown = decide.decision(db, group_id)
    if shown is None:
        st.info("That run was deleted.")
        return
    if shown.state is not None:
        st.caption("Result for the state: " + md(_short(shown.state)))
    if len(shown.tops) > 1:
        if not shown.agree:
            st.warning("Disagreement: " + ", ".join(f"**{md(t)}** → {md(o)}" for t, o in shown.tops.items()))
        else:
            st.success(("Both targets" if len(shown.tops) == 2 else f"All {len(shown.tops)} targets")
                       + f" agree on **{md(next(iter(shown.tops.values())))}**")
    answered = {c.run["target_name"]: c.result for c in shown.cards if c.result is not None and not c.result["error"]}
    if answered:
        st.plotly_chart(charts.probabilities_by_target(
            {t: (res["option_ids"], res["probabilities"]) for t, res in answered.items()}), key=f"{key}-chart")
    cols = st.columns(2) if len(shown.cards) == 2 else [st.container() for _ in shown.cards]
    for col, card in zip(cols, shown.cards):
        run, res = card.run, card.result
        with col.container(border=True):
            kind = "" if run["target"]["kind"] == run["target_name"] else f" · {run['target']['kind']}"
            st.markdown(f"**{md(run['target_name'])}**{kind} · {md(run['model'] or '')}")
            if res is None:
                st.info("No result stored.")
                continue
            if res["error"]:
                st.error(f"This target failed: {md(res['error'])}")
            else:
                p_top = res["probabilities"][res["option_ids"].index(res["top_option"])]
                st.markdown(f"### {md(res['top_option'])}")
                status = res.get("probability_status") or "uncalibrated"
                st.caption(f"p = {p_top:.1%} ({status}) · label mass "
                           + ("n/a" if res["label_mass"] is None else f"{res['label_mass']:.0%}")
                           + f" · readout {md(res.get('readout') or '?')}")
                if res["label_mass"] is not None and res["label_mass"] < 0.3:
                    st.caption("Low label mass: most probability went to tokens that are not options.")
                if card.gate:
                    st.caption(md(card.gate))
            st.caption(md(card.latency))
            with st.expander("Raw request / response", expanded=False):
                st.json({"request": res["request"], "response": res["response"]}, expanded=True)
            with st.expander("Call it yourself (" + ("boto3 / AWS CLI" if run["target"]["kind"] == "sagemaker" else "cURL") + ")"):
                for title, lang, code in decide.snippets(run["target"], res["request"], res["response"]):
                    st.caption(title)
                    st.code(code, language=lang)
    st.caption("Probabilities are uncalibrated until checked against labels on the Calibrate page.")


def _short(state: object, n: int = 160) -> str:
    text = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False)
    return text if len(text) <= n else text[: n - 1] + "…"


def policy_picker(policies: Sequence[P], key: str, default: str = "ticket-routing") -> P:
    """A policy selectbox (names shown): the policy of the other pages (and of the URL) when there is one,
    else the routing template when present; a change here becomes every page's policy."""
    by_id = {p["id"]: p for p in policies}
    ids = list(by_id)
    context.follow(key, "policy", ids, lambda: default if default in ids else ids[0])
    pid = st.selectbox("Policy", ids, format_func=lambda i: policy_service.title(by_id[i]['name'], by_id[i].get('version')), key=key,
                       on_change=context.changed(key, "policy"))
    context.put("policy", pid)
    return by_id[pid]


def flat_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Lists and dicts as JSON text, None as empty: a frame a spreadsheet can open."""
    flat = df.copy()
    for c in flat.columns:
        if flat[c].map(lambda v: isinstance(v, (list, dict))).any():
            flat[c] = flat[c].map(lambda v: None if v is None else json.dumps(v, ensure_ascii=False))
    return flat


def download_frame(df: pd.DataFrame, filename: str, label: str, key: str) -> None:
    st.download_button(label, csv_safe(flat_frame(df)).to_csv(index=False).encode(), file_name=filename,
                       mime="text/csv", key=key)


@dataclass
class CheckSetup:
    """What the Order check and the Robustness page both ask first: policy, states, target, readout."""
    policy: Mapping[str, Any]
    set_id: int | None  # a labeled set of the policy, or None: the pasted states
    pasted: str
    limit: int
    target: str
    variant: str


def saved_policies(db: Store) -> list[Policy] | None:
    """The saved policies, or None after saying how to get the first one (every page that needs one)."""
    saved = queries.policies(db)
    if not saved:
        st.info("No policies yet: load the examples on the Playground page or create one on the Policies page.")
        return None
    return saved


def check_setup(db: Store, key: str, *, default_limit: int, min_limit: int, variants: list[str],
                target_names: list[str]) -> CheckSetup | None:
    """The shared top of a check page: None (after saying so) when there is no policy yet."""
    saved = saved_policies(db)
    if saved is None:
        return None
    policy = policy_picker(saved, key=f"{key}_policy")
    sets = set_service.of_policy(db, policy["id"])
    source = st.radio("States", ["set", "paste"] if sets else ["paste"], horizontal=True, key=f"{key}_source",
                      persist_state=context.KEEP,
                      format_func={"set": "from this policy's labeled set", "paste": "paste (one per line)"}.get)
    pasted = (st.text_area("One state per line", key=f"{key}_paste", persist_state=context.KEEP)
              if source == "paste" else "")
    set_id = st.selectbox("Labeled set", [s["id"] for s in sets], key=f"{key}_set",
                          format_func=lambda i: next(s["name"] for s in sets if s["id"] == i)) if source == "set" else None
    c1, c2, c3 = st.columns(3)
    limit = c1.number_input("States (at most)", min_limit, 500, default_limit, key=f"{key}_limit")
    target = c2.selectbox("Target", target_names, key=f"{key}_target")
    variant = c3.selectbox("Readout", variants, key=f"{key}_variant")
    return CheckSetup(policy, set_id if source == "set" else None, pasted, int(limit), str(target), str(variant))


def check_inputs(db: Store, setup: CheckSetup) -> tuple[list[Any], Any] | None:
    """On a check page's Run: (the states to score, the built target), or None after saying what is wrong."""
    try:
        cases = checks.states(db, set_id=setup.set_id, pasted=setup.pasted, limit=setup.limit)
    except checks.InputError as exc:
        st.error(f"**{md(exc.problems[0])}**")
        return None
    chosen = resources.chosen_targets(db, [setup.target])
    return (cases, chosen[0]) if chosen else None


def saved_check(db: Store, kind: str, key: str, describe: Callable[[Run], str]) -> Run | None:
    """The saved check runs of a kind, newest first, in a picker (`key`; the one just made is opened by
    ui.tasks.collect); the run picked, or None when there is none yet."""
    runs = queries.runs(db, kind=kind)
    if not runs:
        return None
    by_id = {r["id"]: r for r in runs}
    if st.session_state.get(key) not in by_id:
        st.session_state[key] = runs[0]["id"]
    rid = st.selectbox("Saved checks", list(by_id), key=key, format_func=lambda i: f"#{i} · {describe(by_id[i])}")
    return by_id[rid]
