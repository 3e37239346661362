"""Calibrate: labeled sets -> batch evaluation (several targets x readouts) -> metrics, gate, fallback
-> a calibrated policy saved for Deploy (and downloadable)."""
import json

import pandas as pd
import streamlit as st

from app.service import evaluate, review, sets as set_service, targets
from app.ui import charts, resources
from app.ui.components import glossary
from app.ui.safe_text import md


@st.cache_data(show_spinner=False, max_entries=64)
def calibration_view(db_path: str, run_id: int, version: tuple, target_acc: float, per_option: bool) -> dict:
    """The calibration of a run, cached per run content (`version` changes with every stored result)."""
    return evaluate.calibrate(resources.store_at(db_path), run_id, target_accuracy=target_acc, per_option=per_option)


@st.cache_data(show_spinner=False, max_entries=64)
def readout_rows(db_path: str, versions: tuple) -> list[dict]:
    db = resources.store_at(db_path)
    return evaluate.readouts(db, [r for r in (db.get_run(rid) for rid, _ in versions) if r is not None])


def sets_section(db, policies: dict, for_policy: str) -> None:
    """Import shipped sets or an upload; an upload's labels default to the options of the policy
    being calibrated (`for_policy`)."""
    if st.session_state.get("cal_up_for") != for_policy:  # follow the Policy picker until changed here
        st.session_state["cal_up_policy"] = st.session_state["cal_up_for"] = for_policy
    uploading = st.session_state.get("cal_upload") is not None
    # a stable key: the expander keeps the state the user gave it when the sets change underneath
    with st.expander("Labeled sets", expanded=not db.list_labeled_sets() or uploading, key="cal_sets_box"):
        c1, c2 = st.columns(2)
        if c1.button("Import the shipped labeled sets", key="cal_ship"):
            n = set_service.import_shipped(db, policies)
            st.toast(f"{n} shipped sets available")
            if not n:
                st.warning("Load the example policies first (Playground page): the shipped sets label their options.")
        up_policy = c2.selectbox("Labels are options of", list(policies), format_func=lambda i: policies[i]["name"],
                                 key="cal_up_policy")
        upload = c2.file_uploader("Upload CSV / JSONL (state, label, optional id, split, metadata columns)",
                                  type=["csv", "jsonl", "tsv"], key="cal_upload")
        if upload is not None and c2.button("Import", key="cal_import"):
            try:
                sid = set_service.import_upload(db, upload.name, upload.getvalue(), policies[up_policy])
                st.success(f"Imported as set #{sid}.")
            except set_service.InputError as exc:
                st.error("**Upload** rejected, nothing was imported:\n\n"
                         + "\n".join(f"- {md(p)}" for p in exc.problems[:20]))
        sets = db.list_labeled_sets()
        if sets:
            st.dataframe(pd.DataFrame(sets)[["id", "name", "policy_id", "n_rows", "content_hash", "created_at"]],
                         hide_index=True)


def current_policy(policies: dict, sets: dict) -> str:
    """The policy being calibrated: the one picked, else the first that has a labeled set."""
    if st.session_state.get("cal_policy") not in policies:
        with_sets = [p for p in policies if any(s["policy_id"] == p for s in sets.values())]
        st.session_state["cal_policy"] = (with_sets or list(policies))[0]
    return st.session_state["cal_policy"]


def evaluate_section(db, policies: dict, sets: dict) -> tuple[str, int] | None:
    st.subheader("Evaluate")
    c1, c2 = st.columns(2)
    current_policy(policies, sets)
    pid = c1.selectbox("Policy", list(policies), format_func=lambda i: policies[i]["name"], key="cal_policy")
    matching = [s["id"] for s in sets.values() if s["policy_id"] == pid]  # made for this policy first
    others = [s["id"] for s in sets.values() if s["id"] not in matching]
    if st.session_state.get("cal_set") not in matching + others or (
            matching and st.session_state.get("cal_set_for") != pid):
        st.session_state["cal_set"] = (matching or others)[0]  # a new policy picks its own set
    st.session_state["cal_set_for"] = pid
    sid = c2.selectbox("Labeled set", matching + others, key="cal_set",
                       format_func=lambda i: f"#{i} {sets[i]['name']} ({sets[i]['n_rows']} rows)"
                                             + ("" if i in matching else " - made for another policy"))
    if added := review.new_rows(db, sid):
        st.info(f"Set #{sid} is set #{sets[sid]['parent_id']} + {added} reviewed rows: evaluating it scores only "
                f"those {added} rows - the others are copied from the stored results of the same model and request.")
    problem = evaluate.label_mismatch(policies[pid], db.labeled_rows(sid))
    if problem:
        st.error(f"**Labeled set**: {md(problem)}")
    names = targets.names(db)
    c1, c2 = st.columns(2)
    chosen = c1.multiselect("Targets (several local models side by side)", names, default=names[:1], key="cal_targets")
    variants = c2.multiselect("Readouts to compare", list(evaluate.VARIANTS), default=["default"], key="cal_variants",
                              help="default: the policy's readout, else the model's measured default")
    examples = st.radio("Few-shot examples", evaluate.EXAMPLE_SOURCES, horizontal=True, key="cal_examples",
                        format_func={"policy": "the policy's own", "train": "from the set's train split (never scored)"}.get)
    if st.button("Run evaluation (resumes unfinished runs)", type="primary", key="cal_run", disabled=bool(problem)):
        bars: dict = {}

        def progress_for(label: str):
            bars[label] = bar = st.progress(0.0, text=f"{label}: starting…")
            return lambda d, t, e: bar.progress(d / t if t else 1.0, text=f"{label}: {d}/{t} rows"
                                                + ("" if e is None else f" · about {e:.0f} s left"))

        outcomes = evaluate.evaluate(db, policies[pid], sid, resources.chosen_targets(db, chosen) or [], variants,
                                     examples=examples, progress_for=progress_for)
        for o in outcomes:
            if o.label in bars and o.error:
                bars[o.label].empty()
            elif o.label in bars:
                bars[o.label].progress(1.0, text=o.text())
            if o.error:
                st.error(f"**{md(o.label)}**: {md(o.error)}")
            elif o.same_as:
                st.caption(md(o.text()))
        best = evaluate.best_run(db, outcomes)
        if best is not None:  # open the most accurate of the runs just made
            st.session_state["cal_run_pick"] = best
    return pid, sid


def correction_section(cal: dict) -> None:
    """Which correction the export carries, why, and what it does per class (out of fold)."""
    chosen = cal["correction"]
    st.markdown(f"**Correction: {md(chosen.name)}**")
    st.caption(md(cal["correction_why"]))
    table = pd.DataFrame([{"correction": c.name, "scores": c.family, "method": c.method,
                           "accuracy (out of fold)": c.oof_accuracy if c.available else None,
                           "NLL (out of fold)": c.oof_nll if c.available else None,
                           "ECE (out of fold)": c.oof_ece if c.available else None,
                           "temperature": c.temperature if c.available else None,
                           "offsets": ", ".join(f"{o} {b:+.2f}" for o, b in zip(cal["option_ids"], c.offsets))
                           if c.method == "fitted" and c.available else "",
                           "chosen": c.name == chosen.name, "note": c.note} for c in cal["corrections"]])
    st.dataframe(table, hide_index=True, key="cal_corrections", column_config={
        k: st.column_config.NumberColumn(format="%.3f") for k in ("accuracy (out of fold)", "NLL (out of fold)",
                                                                  "ECE (out of fold)", "temperature")})
    rep = cal["report"]
    c1, c2 = st.columns(2)
    c1.plotly_chart(charts.confusion_heatmap(rep.confusion, cal["option_ids"], "As scored"), key="cal_conf")
    c2.plotly_chart(charts.confusion_heatmap(rep.oof_confusion, cal["option_ids"],
                                             f"After {chosen.name} (out of fold)"), key="cal_conf_after")


def export_section(db, run_id: int, cal: dict) -> None:
    rep = cal["report"]
    c1, c2 = st.columns(2)
    fallback = c1.selectbox("Fallback when gated", ["human-review", *cal["option_ids"]], key="cal_fallback")
    manual = c2.checkbox("Set the gate by hand", key="cal_manual")
    hand = None
    if manual:
        hand = st.slider("Gate (calibrated confidence)", 0.0, 1.0, float(cal["gate"].threshold or 0.5), 0.005,
                         key="cal_gate")
    exported = evaluate.export(db, run_id, cal, fallback=fallback, hand_gate=hand)
    gate, config = exported.gate, exported.config
    show = {"recommended": st.success, "hand-set": st.info, "unreachable": st.error}[gate.source]
    show(md(gate.messages[0]) if gate.messages and gate.source != "hand-set" else
         f"Gate set by hand: {gate.threshold:.3f}")
    for note in gate.messages[1:] if gate.source != "hand-set" else gate.messages:
        st.warning(md(note))
    option_thresholds = config["option_thresholds"]
    at = config["metrics"]["at_gate"]
    m = st.columns(3)
    m[0].metric("Accuracy of decided rows", "n/a" if at["accuracy"] is None else f"{at['accuracy']:.1%}",
                help="among the rows the gate lets through (the rest go to the fallback)")
    m[1].metric("Coverage", "n/a" if at["coverage"] is None else f"{at['coverage']:.1%}",
                help=f"rows decided: {at['decided']} of {at['n']}")
    m[2].metric("To the fallback", f"{at['gated']} rows", help=f"sent to {md(fallback)}")
    chance = 1 / len(cal["option_ids"])
    m = st.columns(3)
    m[0].metric("Accuracy, all rows", f"{rep.accuracy:.1%}",
                help=f"top option = label, before any gate; n = {rep.n}; chance = {chance:.0%}")
    m[1].metric("Macro-F1", f"{rep.macro_f1:.2f}")
    m[2].metric("Temperature", f"{rep.temperature:.2f}",
                help="the exported correction's temperature" + (" (with fitted per-option offsets)"
                                                                 if rep.method == "fitted" else ""))
    m = st.columns(3)
    m[0].metric("ECE raw", f"{rep.ece_width:.3f}", help=f"equal-mass bins: {rep.ece_mass:.3f}")
    m[1].metric("ECE corrected", f"{rep.oof_ece_width:.3f}", help=f"out of fold, after {cal['correction'].name}; "
                f"equal-mass bins: {rep.oof_ece_mass:.3f}")
    m[2].metric("Brier / NLL", f"{rep.brier:.3f} / {rep.nll:.3f}")
    g1, g2 = st.columns(2)
    g1.plotly_chart(charts.reliability_diagram(rep.bins_before, rep.bins_after,
                                               f"after {cal['correction'].name} (out of fold)"), key="cal_rel")
    g2.plotly_chart(charts.coverage_curve(cal["curve"], gate.threshold, cal["target_accuracy"]), key="cal_cov")
    correction_section(cal)
    if option_thresholds:
        st.dataframe(pd.DataFrame([{"option": o, **g.to_dict()} for o, g in cal["option_gates"].items()]), hide_index=True)
    narrowing(db, run_id, config)
    nothing = exported.nothing_decided
    if nothing:
        st.warning(md(nothing))
    c1, c2 = st.columns(2)
    if c1.button("Save for deployment", type="primary", key="cal_save"):
        cid = evaluate.save(db, exported)
        st.session_state["cal_saved"] = (cid, config["policy_id"], gate.threshold, fallback)
    c2.download_button("Download calibrated policy (JSON)", json.dumps(config, indent=2, ensure_ascii=False).encode(),
                       file_name=f"{config['policy_id']}.policy.json", mime="application/json", key="cal_download")
    saved = st.session_state.get("cal_saved")
    if saved:
        cid, pid, threshold, fb = saved
        st.success(f"Saved as calibrated policy #{cid}. Next: on the **Deploy** page pick it; Deploy packages it into "
                   f"model.tar.gz and the adapter enforces it: confidence below **{threshold:.3f}** → **{md(fb)}**, "
                   "and any other model than the calibrated one → the fallback too.")
        st.page_link("pages/deploy.py", label="Go to Deploy", icon=":material/cloud_upload:")
    with st.expander("Policy JSON"):
        st.json(config, expanded=False)
    glossary("accuracy", "macro-F1", "Brier", "NLL", "ECE", "ece_corrected", "temperature", "fitted offsets", "letters",
             "option-words", "content-free", "permutation")


def narrowing(db, run_id: int, config: dict) -> None:
    """For a set version made by the review queue: the accuracy at this gate on the parent version
    and on this one, with how much the 95% interval narrowed."""
    change = review.narrowing(db, run_id, config)
    if change is None:
        return
    before_run, before, after = change
    width = [p.high - p.low for p in (before, after) if p.rate is not None and p.high is not None and p.low is not None]
    narrowed = f": the interval went from {width[0]:.1%} to {width[1]:.1%} wide" if len(width) == 2 else ""
    st.info(f"Accuracy of the decided rows at this gate, set #{before_run['labeled_set_id']} (run #{before_run['id']}): "
            f"{before.text()} → this set: {after.text()}{narrowed}.")


def render() -> None:
    st.title("Calibrate")
    st.caption("Probabilities only become operational confidence after they are checked against labels. Evaluate a "
               "policy on a labeled set, fit a temperature, pick the confidence gate for a target accuracy and the "
               "fallback for everything below it, then save the policy the adapter enforces.")
    db = resources.store()
    policies = {p["id"]: p for p in db.list_policies()}
    if not policies:
        st.info("No policies yet: load the examples on the Playground page first.")
        return
    sets_section(db, policies, current_policy(policies, {s["id"]: s for s in db.list_labeled_sets()}))
    sets = {s["id"]: s for s in db.list_labeled_sets()}
    if not sets:
        st.info("Import a labeled set to start (the shipped ones cover ticket routing, refund check, incident "
                "priority and content moderation).")
        return
    chosen = evaluate_section(db, policies, sets)
    if chosen is None:
        return
    pid, sid = chosen
    runs = evaluate.runs_of(db, pid, sid)
    if not runs:
        st.caption("No evaluation of this policy on this set yet.")
        return
    rows = readout_rows(str(db.path), tuple((r["id"], db.run_version(r["id"])) for r in runs))
    st.markdown("**Readouts side by side** (same policy × set)")
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="cal_compare", column_config={
        "accuracy": st.column_config.NumberColumn(format="%.3f"), "macro_f1": st.column_config.NumberColumn(format="%.3f"),
        "ece": st.column_config.NumberColumn(format="%.3f"), "ece_corrected": st.column_config.NumberColumn(format="%.3f"),
        "nll": st.column_config.NumberColumn(format="%.3f")})

    st.subheader("Gate and export")
    ids = [r["id"] for r in runs]
    if st.session_state.get("cal_run_pick") not in ids:  # default: the most accurate finished run
        scored = [r for r in rows if r.get("accuracy") is not None]
        st.session_state["cal_run_pick"] = max(scored, key=lambda r: r["accuracy"])["run"] if scored else ids[0]
    label = {r["run"]: f"#{r['run']} · {r['target']} · {r.get('readout', '?')}"
                       + (f" · accuracy {r['accuracy']:.1%}" if r.get("accuracy") is not None else "") for r in rows}
    rid = st.selectbox("Evaluation run", ids, key="cal_run_pick", format_func=lambda i: label.get(i, f"#{i}"))
    c1, c2 = st.columns(2)
    target_acc = c1.slider("Target accuracy", 0.5, 0.99, 0.9, 0.01, key="cal_target_acc",
                           disabled=bool(st.session_state.get("cal_manual")),
                           help="the gate is chosen to reach it (disabled while the gate is set by hand)")
    per_option = c2.checkbox("Per-option gates", key="cal_per_option")
    try:
        cal = calibration_view(str(db.path), rid, db.run_version(rid), target_acc, per_option)
    except ValueError as exc:
        st.error(md(exc))
        return
    export_section(db, rid, cal)


if __name__ == "__main__":
    resources.run_page(render)
