"""Calibrate: labeled sets -> batch evaluation per readout -> metrics, gate, fallback -> export."""
import json

import pandas as pd
import streamlit as st

from app import charts, evaluation, resources
from app.inputs import InputError
from app.labeled import import_file, shipped_sets
from app.safe_text import md

st.title("Calibrate")
st.caption("Probabilities only become operational confidence after they are checked against labels. Evaluate a "
           "policy on a labeled set, fit a temperature, pick the confidence gate for a target accuracy and the "
           "fallback for everything below it, then export the policy the adapter enforces.")
db = resources.store()
policies = {p["id"]: p for p in db.list_policies()}
if not policies:
    st.info("No policies yet: load the examples on the Playground page first.")
    st.stop()

# -- labeled sets -----------------------------------------------------------------------------------
with st.expander("Labeled sets", expanded=not db.list_labeled_sets()):
    c1, c2 = st.columns(2)
    if c1.button("Import the shipped labeled sets", key="cal_ship"):
        n = 0
        for pid, path in shipped_sets():
            if pid in policies:
                import_file(db, path.name, path.read_bytes(), policies[pid], source=str(path))
                n += 1
        st.toast(f"{n} shipped sets available")
        if not n:
            st.warning("Load the example policies first (Playground page): the shipped sets label their options.")
    up_policy = c2.selectbox("Labels are options of", list(policies), format_func=lambda i: policies[i]["name"],
                             key="cal_up_policy")
    upload = c2.file_uploader("Upload CSV / JSONL (state, label, optional id, split, metadata columns)",
                              type=["csv", "jsonl", "tsv"], key="cal_upload")
    if upload is not None and c2.button("Import", key="cal_import"):
        try:
            sid = import_file(db, upload.name, upload.getvalue(), policies[up_policy])
            st.success(f"Imported as set #{sid}.")
        except InputError as exc:
            st.error("**Upload** rejected, nothing was imported:\n\n" + "\n".join(f"- {md(p)}" for p in exc.problems[:20]))
    sets = db.list_labeled_sets()
    if sets:
        st.dataframe(pd.DataFrame(sets)[["id", "name", "policy_id", "n_rows", "content_hash", "created_at"]],
                     hide_index=True)
sets = {s["id"]: s for s in db.list_labeled_sets()}
if not sets:
    st.info("Import a labeled set to start (the shipped ones cover ticket routing, refund check and incident priority).")
    st.stop()

# -- evaluate ---------------------------------------------------------------------------------------
st.subheader("Evaluate")
c1, c2, c3 = st.columns(3)
pid = c1.selectbox("Policy", list(policies), format_func=lambda i: policies[i]["name"], key="cal_policy")
matching = [s for s in sets.values() if s["policy_id"] in (pid, None)] or list(sets.values())
sid = c2.selectbox("Labeled set", [s["id"] for s in matching], key="cal_set",
                   format_func=lambda i: f"#{i} {sets[i]['name']} ({sets[i]['n_rows']} rows)")
specs = resources.target_specs(db)
tname = c3.selectbox("Target", [s["name"] for s in specs], key="cal_target")
VARIANTS = {"policy default": (None, None, False), "letters": ("letters", "none", False),
            "letters + content-free": ("letters", "content-free", False), "option-words": ("option-words", "none", False),
            "option-words + content-free": ("option-words", "content-free", False),
            "letters + permutation": ("letters", "none", True), "option-words + permutation": ("option-words", "none", True)}
variants = st.multiselect("Readouts to compare", list(VARIANTS), default=["policy default"], key="cal_variants")
examples = st.radio("Few-shot examples", evaluation.EXAMPLE_SOURCES, horizontal=True, key="cal_examples",
                    format_func={"policy": "the policy's own", "train": "from the set's train split (never scored)"}.get)
if st.button("Run evaluation (resumes unfinished runs)", type="primary", key="cal_run"):
    target = resources.make_target(next(s for s in specs if s["name"] == tname))
    resources.load_models([target])
    for v in variants:
        readout, debias, permute = VARIANTS[v]
        run = evaluation.find_run(db, policy=policies[pid], set_id=sid, target_name=tname, readout=readout,
                                  permute=permute, examples=examples, debias=debias)
        rid = run["id"] if run else evaluation.start_eval(db, policy=policies[pid], set_id=sid, target=target,
                                                          readout=readout, permute=permute, examples=examples,
                                                          debias=debias)
        bar = st.progress(0.0, text=f"{v}: starting…")
        out = evaluation.resume_eval(db, rid, target, lambda d, t, e, v=v, bar=bar: bar.progress(
            d / t if t else 1.0, text=f"{v}: {d}/{t} rows" + ("" if e is None else f" · about {e:.0f} s left")))
        bar.progress(1.0, text=f"{v}: done — scored {out['scored']}, reused {out['skipped']}, errors {out['errors']}")
        st.session_state["cal_open"] = rid

runs = [r for r in db.list_runs(kind="eval") if r["labeled_set_id"] == sid and r["policy_id"] == pid]
if not runs:
    st.caption("No evaluation of this policy on this set yet.")
    st.stop()

rows = evaluation.readout_table(db, runs)
st.markdown("**Readouts side by side** (same policy × set)")
st.dataframe(pd.DataFrame(rows), hide_index=True, key="cal_compare")

# -- calibrate one run ------------------------------------------------------------------------------
st.subheader("Gate and export")
ids = [r["id"] for r in runs]
default = st.session_state.get("cal_open")
rid = st.selectbox("Evaluation run", ids, index=ids.index(default) if default in ids else 0, key="cal_run_pick",
                   format_func=lambda i: next(f"#{x['run']} · {x['target']} · {x.get('readout', '?')}" for x in rows if x["run"] == i))
c1, c2, c3 = st.columns(3)
target_acc = c1.slider("Target accuracy", 0.5, 0.99, 0.9, 0.01, key="cal_target_acc")
per_option = c2.checkbox("Per-option gates", key="cal_per_option")
try:
    cal = evaluation.calibrate_run(db, rid, target_accuracy=target_acc, per_option=per_option)
except ValueError as exc:
    st.error(str(exc))
    st.stop()
rep, gate = cal["report"], cal["gate"]
fallbacks = ["human-review", *cal["option_ids"]]
fallback = c3.selectbox("Fallback when gated", fallbacks, key="cal_fallback")
manual = st.checkbox("Set the gate by hand", key="cal_manual")
if rep.size_flag == "too-small":
    st.warning(f"Only {rep.n} labeled rows: no gate is recommended below 50. Label more rows.")
elif rep.size_flag == "provisional":
    st.info(f"{rep.n} labeled rows: treat the gate as provisional (< 200 rows).")
if rep.temperature >= 19.9:
    st.warning("The fitted temperature hit its upper bound (20): the model's probabilities carry almost no "
               "information about correctness on this set.")
if manual:
    threshold = st.slider("Gate (calibrated confidence)", 0.0, 1.0, float(gate.threshold or 0.5), 0.005, key="cal_gate")
elif gate.reachable and rep.size_flag != "too-small":
    threshold = gate.threshold
    st.success(f"Gate {threshold:.3f} reaches {target_acc:.0%}: held-out accuracy {gate.holdout_accuracy:.1%} at "
               f"coverage {gate.holdout_coverage:.1%} ({gate.holdout_accepted}/{gate.holdout_n} held-out rows).")
else:
    threshold = 1.0
    st.error(f"Target {target_acc:.0%} is unreachable ({gate.note or 'too few rows'}): the exported policy sends "
             f"every case to `{fallback}`. Lower the target, set a gate by hand, or use a stronger model.")

m = st.columns(3) + st.columns(3)
m[0].metric("Accuracy", f"{rep.accuracy:.1%}")
m[1].metric("Macro-F1", f"{rep.macro_f1:.2f}")
m[2].metric("ECE raw → scaled", f"{rep.ece_width:.3f} → {rep.oof_ece_width:.3f}", help="10 equal-width bins; "
            f"equal-mass: {rep.ece_mass:.3f} → {rep.oof_ece_mass:.3f}. 'scaled' is out of fold.")
m[3].metric("Temperature", f"{rep.temperature:.3f}")
m[4].metric("Brier / NLL", f"{rep.brier:.3f} / {rep.nll:.3f}")
option_thresholds = {o: g.threshold for o, g in cal["option_gates"].items() if g.reachable}
config = evaluation.build_policy(db, rid, cal, threshold=threshold, fallback=fallback,
                                 option_thresholds=option_thresholds)
at = config["metrics"]["at_gate"]
m[5].metric("Coverage at gate", "n/a" if at["coverage"] is None else f"{at['coverage']:.1%}",
            help=f"decided {at['decided']} of {at['n']}; accuracy of decided: "
                 + ("n/a" if at["accuracy"] is None else f"{at['accuracy']:.1%}"))
g1, g2 = st.columns(2)
g1.plotly_chart(charts.reliability_diagram(rep.bins_before, rep.bins_after), key="cal_rel")
g2.plotly_chart(charts.coverage_curve(cal["curve"], threshold, target_acc), key="cal_cov")
st.plotly_chart(charts.confusion_heatmap(rep.confusion, cal["option_ids"]), key="cal_conf")
if option_thresholds:
    st.dataframe(pd.DataFrame([{"option": o, **g.to_dict()} for o, g in cal["option_gates"].items()]), hide_index=True)
st.download_button("Download calibrated policy (JSON)", json.dumps(config, indent=2, ensure_ascii=False).encode(),
                   file_name=f"{config['policy_id']}.policy.json", mime="application/json", key="cal_download",
                   type="primary")
with st.expander("Policy JSON"):
    st.json(config, expanded=False)
