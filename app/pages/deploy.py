"""Deploy: pick a calibrated policy (saved on Calibrate, or uploaded) -> plan (packaged first, so
the plan shown is the plan that runs) -> confirm -> watch; every action in an audit log; a live
endpoint becomes a target. Failed attempts are listed apart from deployments."""
import json
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import streamlit as st

from adapter.calibrated import PolicyError, load_policy
from adapter.catalog import SHIPPED
from app.ui import resources
from app.core.deploy_records import apply_and_record, destroy_and_record, record_planned, record_result
from app.ui.safe_text import md
from app.core.settings import WorkbenchSettings
from deploy.autoscaling import decisions_per_second
from deploy.config import COMPUTES, DEFAULT_POOLS, SERVINGS, DeployConfig, FormErrors, config_from_form
from deploy.executor import DeployError, Executor
from deploy.package import build_package
from deploy.plan import Package, deployment_plan
from deploy.pricing import cost_per_1000, first_choice, hint
from deploy.validate import validate_plan

WORK = Path(tempfile.gettempdir()) / "semif-deploy"
FIELD_LABELS = {"bucket": "S3 bucket", "role_arn": "SageMaker execution role ARN", "codebuild_role_arn":
                "CodeBuild service role ARN", "instance_type": "CPU instance type", "pools": "GPU instance pool",
                "model_path": "Model GGUF", "policy_path": "Calibrated policy", "region": "Region",
                "autoscale_max": "Autoscaling", "decisions_per_second": "Measured decisions/s"}
NO_POLICY = 0
UPLOAD = -1


def policy_picker(db) -> tuple[str, str]:
    """(path of the calibrated policy JSON to ship, the model it was calibrated on) - '' for none."""
    saved = {c["id"]: c for c in db.list_calibrated()}
    if "dep_cal" not in st.session_state and saved:  # the policy just saved on Calibrate, else the newest
        just = (st.session_state.get("cal_saved") or [None])[0]
        st.session_state["dep_cal"] = just if just in saved else next(iter(saved))
    choice = st.selectbox("Calibrated policy the adapter enforces", [NO_POLICY, *saved, UPLOAD], key="dep_cal",
                          format_func=lambda i: "none (raw probabilities)" if i == NO_POLICY else "upload a policy JSON…"
                          if i == UPLOAD else f"#{i} {saved[i]['name']} · gate {saved[i]['threshold']:.3f} "
                                              f"({saved[i]['gate_source']}) · accuracy "
                                              + ("n/a" if saved[i]["accuracy"] is None else f"{saved[i]['accuracy']:.0%}")
                                              + f" at coverage {saved[i]['coverage'] or 0:.0%} · {saved[i]['created_at'][:16]}")
    if choice == NO_POLICY:
        return "", ""
    if choice == UPLOAD:
        up = st.file_uploader("Calibrated policy (.json from the Calibrate page)", type=["json"], key="dep_cal_upload")
        if up is None:
            return "", ""
        try:
            config = load_policy(json.loads(up.getvalue())).model_dump(mode="json")
        except (PolicyError, ValueError) as exc:
            st.error(f"**Calibrated policy**: {md(exc)}")
            return "", ""
    else:
        config = saved[choice]["config"]
    path = WORK / "policies" / f"{config['policy_id']}-{choice}.policy.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2))
    st.caption(f"Calibrated on {md(config['model']['file'])}: deploy that model. The adapter answers "
               f"**{md(config['fallback_option'])}** when the confidence is below {config['threshold']:.3f} - and for every "
               "row if a different model is deployed.")
    return str(path), config["model"]["file"]


def discard_unconfirmed_package(keep: Package) -> None:
    """Remove the package folder of the plan on screen (never confirmed), unless it is `keep`'s."""
    old = st.session_state.pop("dep_pkg", None)
    if old and Path(old["model_file"]).parent != Path(keep.model_file).parent:
        shutil.rmtree(Path(old["model_file"]).parent, ignore_errors=True)


def plan_form(db) -> tuple:
    """The plan inputs; returns the ones outside the form (a change there makes a shown plan stale)."""
    c1, c2, c3 = st.columns(3)
    serving = c1.radio("Serving path", SERVINGS, index=SERVINGS.index("semif"), horizontal=True, key="dep_path",
                       format_func={"textgen": "llama.cpp DLC (chat completions)", "semif": "SemIf adapter image"}.get)
    compute = c2.radio("Compute", COMPUTES, horizontal=True, key="dep_compute",
                       format_func={"cpu": "CPU", "gpu": "GPU instance pool"}.get)
    cfg = WorkbenchSettings.from_env()
    region = c3.text_input("Region", cfg.region, key="dep_region")
    policy_path, calibrated_on = policy_picker(db) if serving == "semif" else ("", "")
    shipped = {m.file_name: name for name, m in SHIPPED.items()}
    with st.form("dep_form"):
        c1, c2 = st.columns(2)
        model = c1.text_input("Model GGUF (path or shipped name; empty = the calibrated model, else the default)",
                              key="dep_model")
        bucket = c2.text_input("S3 bucket for model.tar.gz", cfg.deploy_bucket, key="dep_bucket")
        role = c1.text_input("SageMaker execution role ARN", cfg.sagemaker_role_arn, key="dep_role")
        cb_role = c2.text_input("CodeBuild service role ARN (SemIf path)", cfg.codebuild_role_arn,
                                key="dep_cb_role") if serving == "semif" else ""
        if compute == "cpu":
            cpu_type = c1.text_input("CPU instance type", "ml.c7i.xlarge", key="dep_cpu_type")
            pools = pd.DataFrame(DEFAULT_POOLS, columns=["instance_type", "priority"])
        else:
            cpu_type = "ml.c7i.xlarge"
            st.markdown("**GPU instance pool** (priority 1 is tried first; at most 5)")
            pools = st.data_editor(pd.DataFrame(DEFAULT_POOLS, columns=["instance_type", "priority"]),
                                   num_rows="dynamic", key="dep_pools", hide_index=True)
        c1, c2 = st.columns(2)
        scale_max = c1.number_input("Autoscaling: at most N instances (1 = no autoscaling)", 1, 20, 1, key="dep_scale_max")
        dps = c2.text_input("Measured decisions/s per instance (empty = the instance family's default)", key="dep_dps")
        planned = st.form_submit_button("Plan", type="primary")
    outside = (serving, compute, region, policy_path)
    if not planned:
        return outside
    ref = model.strip() or shipped.get(calibrated_on, "")
    try:
        from adapter.models import resolve_model

        gguf = str(resolve_model(ref).path) if ref in SHIPPED else ref
        cfg = config_from_form({"region": region, "bucket": bucket, "role_arn": role, "serving": serving,
                                "compute": compute, "model_path": gguf, "policy_path": policy_path,
                                "codebuild_role_arn": cb_role, "instance_type": cpu_type,
                                "pools": pools.to_dict("records"),
                                "autoscale_max": scale_max if scale_max > 1 else "", "decisions_per_second": dps})
        with st.spinner(f"Packaging the model into {WORK} (local; its checksum goes into the plan)…"):
            pkg = build_package(cfg, WORK)
        discard_unconfirmed_package(keep=pkg)  # a plan replaced before it ran: its package (hundreds of MB) goes
        old = st.session_state.get("dep_cfg")
        if old and old.get("deployment_id") != cfg.deployment_id:
            record_result(db, old["deployment_id"], "plan", "superseded", f"replaced by the plan {cfg.deployment_id}")
        st.session_state["dep_cfg"], st.session_state["dep_pkg"] = cfg.to_dict(), asdict(pkg)
        record_planned(db, cfg, [s.to_dict() for s in deployment_plan(cfg, pkg)])  # every plan is in the audit log
        st.session_state["dep_planned_for"] = outside
    except FormErrors as exc:
        st.session_state.pop("dep_cfg", None)  # no plan from earlier settings stays confirmable
        for field, msg in exc.errors.items():
            st.error(f"**{FIELD_LABELS.get(field, field)}**: {md(msg)}")
    except (ValueError, OSError) as exc:
        st.session_state.pop("dep_cfg", None)
        st.error(f"**Model**: cannot package it: {md(exc)}")
    return outside


def plan_and_confirm(db, endpoint_url, runtime_url, poll) -> None:
    cfg = DeployConfig.from_dict(st.session_state["dep_cfg"])
    pkg = Package(**st.session_state["dep_pkg"])
    steps = deployment_plan(cfg, pkg)  # exactly what runs on confirm (<account-id> is filled from STS)
    errors = validate_plan(steps, cfg.region, allow_account_placeholder=True)
    st.subheader(f"Plan for `{cfg.endpoint_name}`")
    st.markdown(f"**Cost while running:** {hint(cfg)}"
                + (f"; autoscaling runs {cfg.autoscaling.min_instances}-{cfg.autoscaling.max_instances} instances, so up to "
                   f"{cfg.autoscaling.max_instances / cfg.instance_count:g}x that when scaled out"
                   if cfg.autoscaling and cfg.autoscaling.max_instances > cfg.instance_count else "")
                + " (on-demand list prices, us-east-1; a hint, not a quote)")
    rate = decisions_per_second(cfg)
    itype = first_choice(cfg.compute, cfg.instance_type, cfg.pools) or cfg.instance_type
    if rate:
        usd, note = cost_per_1000(itype, rate)
        measured = bool(cfg.autoscaling and cfg.autoscaling.decisions_per_second)
        st.markdown(f"**Cost per 1,000 decisions on {itype}:** " + (f"~${usd:.4f}" if usd is not None else "unknown")
                    + f" at {rate:g} decisions/s per instance ("
                    + ("your measurement" if measured else "the instance family's default; measure yours with "
                       "`python -m app bench` and enter it above") + f"); {md(note)}")
    st.dataframe(pd.DataFrame([{"#": i, "call": f"{s.service}.{s.operation}", "what": s.description}
                               for i, s in enumerate(steps, 1)]), hide_index=True)
    with st.expander("Every call with its parameters (validated offline against botocore's service model)"):
        st.json([s.to_dict() for s in steps], expanded=False)
    st.download_button("Download the plan (JSON)", json.dumps({"deployment_id": cfg.deployment_id, "config": cfg.to_dict(),
                                                              "steps": [s.to_dict() for s in steps]}, indent=2,
                                                             default=str).encode(),
                       file_name=f"{cfg.deployment_id}.plan.json", mime="application/json", key="dep_plan_dl")
    if errors:
        st.error("The plan is invalid, nothing can run:\n\n" + "\n".join(f"- {md(e)}" for e in errors))
        return
    ok = st.checkbox("I understand this creates billable AWS resources", key="dep_ack")
    if not st.button("Confirm and deploy", type="primary", disabled=not ok, key="dep_go"):
        return
    bar = st.progress(0.0, text="starting…")
    log = st.status("Deploying…", expanded=True)

    def on_event(e):
        if e.get("total") and e.get("index"):
            bar.progress(min(e["index"] / e["total"], 1.0), text=f"step {e['index']}/{e['total']}: {e['message']}")
        if e.get("phase") in ("done", "error", "package", "wait"):
            log.write(e["message"])

    try:
        out = apply_and_record(db, cfg, Executor(cfg.region, endpoint_url=endpoint_url, poll_seconds=poll,
                                                 on_event=on_event), steps=steps, pkg=pkg, runtime_url=runtime_url)
        status = out["status"]["status"]
        bar.empty()
        log.update(label=f"{cfg.endpoint_name}: {status}", state="complete")
        st.success(f"`{cfg.endpoint_name}` is {status}; it is now a target in the Playground and Compare pages.")
    except DeployError as exc:
        bar.empty()  # no stale "starting…" above the error
        log.update(label="Deployment failed", state="error")
        st.error(md(exc))
    st.session_state.pop("dep_cfg", None)
    st.session_state.pop("dep_pkg", None)


def deployments(db, endpoint_url, poll) -> None:
    st.subheader("Deployments")
    deps = db.list_deployments()
    unsettled = ("failed", "planned", "superseded")  # attempts and plans that never ran
    live = [d for d in deps if d["status"] not in unsettled]
    failed = [d for d in deps if d["status"] in unsettled]
    cols = ("id", "path", "compute", "region", "status", "created_at", "updated_at")
    if live:
        st.dataframe(pd.DataFrame([{k: d[k] for k in cols} for d in live]), hide_index=True)
    else:
        st.caption("None yet.")
    if failed:
        with st.expander(f"Plans not deployed and failed attempts ({len(failed)})"):
            st.dataframe(pd.DataFrame([{k: d[k] for k in cols} for d in failed]), hide_index=True)
    if not deps:
        return
    by_id = {d["id"]: d for d in live + failed}
    pick = st.selectbox("Deployment", list(by_id), key="dep_pick",
                        format_func=lambda i: f"{i} · {by_id[i]['status']}")
    dep = by_id[pick]
    c1, c2 = st.columns(2)
    if c1.button("Refresh status", key="dep_refresh"):
        try:
            st.json(Executor(dep["region"], endpoint_url=endpoint_url).status(dep["endpoint_name"]))
        except DeployError as exc:
            st.error(md(exc))
    with c2.popover("Destroy"):
        st.write(f"Deletes endpoint, endpoint config and model of **{md(dep['endpoint_name'])}**. Type its name to confirm.")
        typed = st.text_input("Endpoint name", key="dep_confirm_name")
        if st.button("Destroy", type="primary", disabled=typed != dep["endpoint_name"], key="dep_destroy"):
            try:
                destroy_and_record(db, dep["endpoint_name"], Executor(dep["region"], endpoint_url=endpoint_url,
                                                                     poll_seconds=poll))
                st.rerun()
            except DeployError as exc:
                st.error(md(exc))
    st.markdown("**Audit log**")
    st.dataframe(pd.DataFrame(db.audit_log(pick)), hide_index=True)


def render() -> None:
    st.title("Deploy to SageMaker")
    db = resources.store()
    settings = WorkbenchSettings.from_env()
    endpoint_url, runtime_url, poll = settings.aws_endpoint_url, settings.aws_runtime_url, settings.deploy_poll
    if endpoint_url:
        st.info(f"AWS calls go to **{endpoint_url}** (SEMIF_AWS_ENDPOINT_URL), not to AWS.")
    st.caption("Credentials come from the normal AWS chain (AWS_PROFILE, environment, SSO); none are stored here.")
    outside = plan_form(db)
    if st.session_state.get("dep_cfg"):
        if st.session_state.get("dep_planned_for") != outside:
            st.warning("The serving path, compute, region or calibrated policy changed since the last plan: "
                       "press **Plan** again to see (and confirm) the plan for these settings.")
        else:
            plan_and_confirm(db, endpoint_url, runtime_url, poll)
    deployments(db, endpoint_url, poll)


if __name__ == "__main__":
    resources.run_page(render)
