"""Deploy: plan -> confirm -> watch a SageMaker deployment (text-gen DLC or SemIf image, CPU or a
GPU instance pool); every action recorded with an audit log; a live endpoint becomes a target."""
import os

import pandas as pd
import streamlit as st

from app import resources
from deploy.config import COMPUTES, DEFAULT_POOLS, PATHS, DeployConfig
from deploy.executor import DeployError, Executor
from deploy.plan import default_package, deployment_plan
from deploy.pricing import hint
from deploy.records import apply_and_record, destroy_and_record
from deploy.validate import validate_plan

st.title("Deploy to SageMaker")
db = resources.store()
endpoint_url = os.environ.get("SEMIF_AWS_ENDPOINT_URL") or None
runtime_url = os.environ.get("SEMIF_AWS_RUNTIME_URL") or endpoint_url  # sagemaker-runtime (tests: a local shim)
poll = float(os.environ.get("SEMIF_DEPLOY_POLL", "15"))
if endpoint_url:
    st.info(f"AWS calls go to **{endpoint_url}** (SEMIF_AWS_ENDPOINT_URL), not to AWS.")
st.caption("Credentials come from the normal AWS chain (AWS_PROFILE, environment, SSO); none are stored here.")

with st.form("dep_form"):
    c1, c2, c3 = st.columns(3)
    path = c1.radio("Serving path", PATHS, index=PATHS.index("semif"), horizontal=True, key="dep_path",
                    format_func={"textgen": "llama.cpp DLC (chat completions)", "semif": "SemIf adapter image"}.get)
    compute = c2.radio("Compute", COMPUTES, horizontal=True, key="dep_compute",
                       format_func={"cpu": "CPU", "gpu": "GPU instance pool"}.get)
    region = c3.text_input("Region", os.environ.get("AWS_DEFAULT_REGION", "us-east-1"), key="dep_region")
    c1, c2 = st.columns(2)
    model = c1.text_input("Model GGUF (path; empty = the shipped default)", key="dep_model")
    policy = c2.text_input("Calibrated policy JSON to ship in model.tar.gz (optional path)", key="dep_policy")
    bucket = c1.text_input("S3 bucket for model.tar.gz", os.environ.get("SEMIF_DEPLOY_BUCKET", ""), key="dep_bucket")
    role = c2.text_input("SageMaker execution role ARN", os.environ.get("SEMIF_SAGEMAKER_ROLE_ARN", ""), key="dep_role")
    cb_role = c1.text_input("CodeBuild service role ARN (SemIf path)", os.environ.get("SEMIF_CODEBUILD_ROLE_ARN", ""),
                            key="dep_cb_role")
    cpu_type = c2.text_input("CPU instance type", "ml.c7i.xlarge", key="dep_cpu_type")
    st.markdown("**GPU instance pool** (priority 1 is tried first; at most 5)")
    pools = st.data_editor(pd.DataFrame(DEFAULT_POOLS, columns=["instance_type", "priority"]), num_rows="dynamic",
                           key="dep_pools", hide_index=True)
    planned = st.form_submit_button("Plan", type="primary")

if planned:
    problems = {k: "required" for k, v in {"bucket": bucket, "role ARN": role}.items() if not v.strip()}
    if path == "semif" and not cb_role.strip():
        problems["CodeBuild role ARN"] = "required for the SemIf path (it builds the image)"
    if problems:
        for k, v in problems.items():
            st.error(f"**{k}**: {v}")
    else:
        pool_rows = [(str(r["instance_type"]).strip(), int(r["priority"])) for r in pools.dropna().to_dict("records")
                     if str(r["instance_type"]).strip()]
        cfg = DeployConfig(region=region.strip(), bucket=bucket.strip(), role_arn=role.strip(), path=path,
                           compute=compute, model_path=model.strip(), policy_path=policy.strip(),
                           codebuild_role_arn=cb_role.strip(), instance_type=cpu_type.strip(), pools=pool_rows)
        st.session_state["dep_cfg"] = cfg.to_dict()

if st.session_state.get("dep_cfg"):
    cfg = DeployConfig(**{**st.session_state["dep_cfg"], "pools": [tuple(p) for p in st.session_state["dep_cfg"]["pools"]]})
    steps = deployment_plan(cfg, default_package(cfg))
    errors = validate_plan(steps, cfg.region)
    st.subheader(f"Plan for `{cfg.endpoint_name}`")
    st.markdown(f"**Cost while running:** {hint(cfg)} (on-demand list prices, us-east-1; a hint, not a quote)")
    st.dataframe(pd.DataFrame([{"#": i, "call": f"{s.service}.{s.operation}", "what": s.description}
                               for i, s in enumerate(steps, 1)]), hide_index=True)
    with st.expander("Every call with its parameters (validated offline against botocore's service model)"):
        st.json([s.to_dict() for s in steps], expanded=False)
    if errors:
        st.error("The plan is invalid, nothing can run:\n\n" + "\n".join(f"- {e}" for e in errors))
    else:
        ok = st.checkbox("I understand this creates billable AWS resources", key="dep_ack")
        if st.button("Confirm and deploy", type="primary", disabled=not ok, key="dep_go"):
            bar = st.progress(0.0, text="starting…")
            log = st.status("Deploying…", expanded=True)

            def on_event(e):
                if e.get("total") and e.get("index"):
                    bar.progress(min(e["index"] / e["total"], 1.0), text=f"step {e['index']}/{e['total']}: {e['message']}")
                if e.get("phase") in ("done", "error", "package") or (e.get("phase") == "wait"):
                    log.write(e["message"])

            try:
                out = apply_and_record(db, cfg, [s.to_dict() for s in steps],
                                       Executor(cfg.region, endpoint_url=endpoint_url, poll_seconds=poll, on_event=on_event),
                                       runtime_url=runtime_url)
                status = out["status"]["status"]
                log.update(label=f"{cfg.endpoint_name}: {status}", state="complete")
                st.success(f"`{cfg.endpoint_name}` is {status}; it is now a target in the Playground and Compare pages.")
            except DeployError as exc:
                log.update(label="Deployment failed", state="error")
                st.error(str(exc))
            st.session_state.pop("dep_cfg", None)

st.subheader("Deployments")
deps = db.list_deployments()
if not deps:
    st.caption("None yet.")
    st.stop()
st.dataframe(pd.DataFrame([{k: d[k] for k in ("id", "path", "compute", "region", "status", "created_at", "updated_at")}
                           for d in deps]), hide_index=True)
by_id = {d["id"]: d for d in deps}
pick = st.selectbox("Deployment", list(by_id), key="dep_pick")
dep = by_id[pick]
c1, c2 = st.columns(2)
if c1.button("Refresh status", key="dep_refresh"):
    try:
        s = Executor(dep["region"], endpoint_url=endpoint_url).status(dep["endpoint_name"])
        st.json(s)
    except DeployError as exc:
        st.error(str(exc))
with c2.popover("Destroy"):
    st.write(f"Deletes endpoint, endpoint config and model of **{dep['endpoint_name']}**. Type its name to confirm.")
    typed = st.text_input("Endpoint name", key="dep_confirm_name")
    if st.button("Destroy", type="primary", disabled=typed != dep["endpoint_name"], key="dep_destroy"):
        try:
            destroy_and_record(db, dep["endpoint_name"], Executor(dep["region"], endpoint_url=endpoint_url, poll_seconds=poll))
            st.rerun()
        except DeployError as exc:
            st.error(str(exc))
st.markdown("**Audit log**")
st.dataframe(pd.DataFrame(db.audit_log(pick)), hide_index=True)
