"""Deploy: pick a calibrated policy (saved on Calibrate, or uploaded) -> plan (packaged first, so
the plan shown is the plan that runs) -> confirm -> watch; every action in an audit log; a live
endpoint becomes a target. Failed attempts are listed apart from deployments. "Run locally" runs the
same plan in the local SemIf container (SageMaker's "local mode") and makes it a target too."""
from typing import Any, Mapping

import pandas as pd
import streamlit as st

from app.core.store import Store
from app.settings import WorkbenchSettings
from deploy.config import FormErrors
from deploy.errors import DeployError
from app.service import checks, deploy, queries, registry
from app.ui import context, resources
from app.ui.safe_text import md
from app.ui.keys import CALIBRATE, DEPLOY

FIELD_LABELS = {"bucket": "S3 bucket", "role_arn": "SageMaker execution role ARN", "codebuild_role_arn":
                "CodeBuild service role ARN", "instance_type": "CPU instance type", "pools": "GPU instance pool",
                "model_path": "Model GGUF", "policy_path": "Calibrated policy", "region": "Region",
                "autoscale_max": "Autoscaling", "decisions_per_second": "Measured decisions/s"}
NO_POLICY = 0
UPLOAD = -1
REGISTRY = -2  # a models:/NAME@ALIAS reference (shown when SEMIF_MLFLOW_TRACKING_URI is set)

KEYS = DEPLOY  # this page's session and widget keys


def policy_picker(db: Store) -> tuple[str, str]:
    """(path of the calibrated policy JSON to ship, the sha256 of the model it was calibrated on) - '' for none."""
    saved = deploy.calibrated(db)
    if KEYS.cal not in st.session_state and saved:  # the policy just saved on Calibrate, else the newest
        just = (st.session_state.get(CALIBRATE.saved) or [None])[0]
        st.session_state[KEYS.cal] = just if just in saved else next(iter(saved))
    context.follow(KEYS.cal, "calibrated", list(saved))  # ?calibrated=3 (a reload) picks it again
    extra = [REGISTRY] if registry.enabled() else []
    choice = st.selectbox("Calibrated policy the adapter enforces", [NO_POLICY, *saved, UPLOAD, *extra], key=KEYS.cal,
                          on_change=context.changed(KEYS.cal, "calibrated"),
                          format_func=lambda i: "none (raw probabilities)" if i == NO_POLICY else "upload a policy JSON…"
                          if i == UPLOAD else "from the MLflow registry (models:/…)…" if i == REGISTRY
                          else deploy.calibrated_label(saved[i]))
    if choice == NO_POLICY:
        return "", ""
    if choice == REGISTRY:  # resolved to its file now: the package holds that file, never the reference
        ref = st.text_input("Registry reference", placeholder="models:/semif-ticket-routing@production", key=KEYS.cal_ref)
        try:
            config = deploy.from_registry(db, ref) if ref.strip() else None
        except ValueError as exc:
            st.error(f"**Calibrated policy**: {md(exc)}")
            return "", ""
        if config is None:
            return "", ""
    elif choice == UPLOAD:
        up = st.file_uploader("Calibrated policy (.json from the Calibrate page)", type=["json"], key=KEYS.cal_upload)
        if up is None:
            return "", ""
        try:
            config = deploy.load_calibrated(up.getvalue())
        except ValueError as exc:  # not JSON, or not a valid calibrated policy (the message names the field)
            st.error(f"**Calibrated policy**: {md(exc)}")
            return "", ""
    else:
        config = saved[choice]["config"]
        if newer := deploy.newer_version(db, saved[choice]):
            st.warning(md(newer))
    steering_verdict(db, choice)
    try:
        path = deploy.policy_file(config, choice)  # validated again (a saved one too) and kept inside its folder
    except ValueError as exc:
        st.error(f"**Calibrated policy**: {md(exc)}")
        return "", ""
    rate = deploy.measured_rate(db, config)
    # the pace measured on Calibrate for this pick (refreshed when another is picked), unless one was typed
    st.session_state[KEYS.dps], st.session_state[KEYS.dps_filled] = deploy.rate_prefill(
        str(st.session_state.get(KEYS.dps) or ""), st.session_state.get(KEYS.dps_filled), choice,
        rate[0] if rate is not None else None)
    if rate is not None:
        st.caption(f"Decisions/s per instance below: {rate[0]:.3g}, {md(rate[1])} - replace it with a figure from "
                   "the instance when you have one.")
    gate = config.get("threshold")
    st.caption(f"Calibrated on {md(config['model']['file'])}: deploy that model (a plan with another model is "
               f"refused). The adapter answers **{md(config['fallback_option'])}** "
               + (f"when the confidence is below {gate:.3f}." if isinstance(gate, (int, float)) else
                  "only for rows the steering guard or a per-option gate sends there (no global gate)."))
    return str(path), config["model"]["sha256"]


def steering_verdict(db: Store, choice: int) -> None:
    """The newest Robustness check of this calibrated policy as deployed (its own guard, head, gate),
    or 'not checked' - a saved policy never looks checked by a check of something else."""
    if choice in (UPLOAD, REGISTRY):
        st.caption("Steering: not checked (an uploaded file or a registry version; save it and run Robustness on it "
                   "as deployed).")
        return
    found = checks.deployed_verdict(db, choice)
    if found is None:
        st.warning(f"Steering: **not checked** - calibrated #{choice} was never tested as deployed on the Robustness "
                   "page (pick it there as the calibrated policy).")
        return
    level, text, run_id = found
    {"ok": st.success, "warn": st.warning, "bad": st.error}[level](
        f"Steering as deployed (Robustness run #{run_id}): {md(text)}")


def plan_form(db: Store) -> tuple[str, str, str, str]:
    """The plan inputs; returns the ones outside the form (a change there makes a shown plan stale)."""
    c1, c2, c3 = st.columns(3)
    start = deploy.form_defaults(db, WorkbenchSettings.from_env())  # the environment's, else the last plan's
    serving = c1.radio("Serving path", start.servings, index=start.servings.index(start.serving), horizontal=True,
                       key=KEYS.path, persist_state=context.KEEP,
                       format_func={"textgen": "llama.cpp DLC (chat completions)", "semif": "SemIf adapter image"}.get)
    compute = c2.radio("Compute", start.computes, index=start.computes.index(start.compute), horizontal=True,
                       key=KEYS.compute, persist_state=context.KEEP,
                       format_func={"cpu": "CPU", "gpu": "GPU instance pool"}.get)
    region = c3.text_input("Region", start.region, key=KEYS.region, persist_state=context.KEEP)
    policy_path, calibrated_sha = policy_picker(db) if serving == "semif" else ("", "")
    outside = (serving, compute, region, policy_path)
    form, local = form_fields(start, serving, compute)
    if form is not None:
        make_plan(db, {**form, "region": region, "serving": serving, "compute": compute, "policy_path": policy_path},
                  outside, local, calibrated_sha)
    return outside


def form_fields(start: deploy.FormStart, serving: str, compute: str) -> tuple[dict[str, Any] | None, bool]:
    """The fields inside the form: (what they hold once Plan or Plan a local run is pressed, else None; local)."""
    with st.form(KEYS.form):
        c1, c2 = st.columns(2)
        model = c1.text_input("Model GGUF (path or shipped name; empty = the calibrated model, else the default)",
                              key=KEYS.model, persist_state=context.KEEP)
        bucket = c2.text_input("S3 bucket for model.tar.gz", start.bucket, key=KEYS.bucket,
                               persist_state=context.KEEP)
        role = c1.text_input("SageMaker execution role ARN", start.role_arn, key=KEYS.role,
                             persist_state=context.KEEP)
        cb_role = c2.text_input("CodeBuild service role ARN (SemIf path)", start.codebuild_role_arn,
                                key=KEYS.cb_role, persist_state=context.KEEP) if serving == "semif" else ""
        if compute == "cpu":
            cpu_type = c1.text_input("CPU instance type", start.cpu_instance, key=KEYS.cpu_type,
                                     persist_state=context.KEEP)
            pools = pd.DataFrame(list(start.pools), columns=["instance_type", "priority"])
        else:
            cpu_type = start.cpu_instance
            st.markdown("**GPU instance pool** (priority 1 is tried first; at most 5)")
            pools = st.data_editor(pd.DataFrame(list(start.pools), columns=["instance_type", "priority"]),
                                   num_rows="dynamic", key=KEYS.pools, hide_index=True)
        c1, c2 = st.columns(2)
        scale_max = c1.number_input("Autoscaling: at most N instances (1 = no autoscaling)", 1, 20, 1, key=KEYS.scale_max,
                                    persist_state=context.KEEP)
        dps = c2.text_input("Measured decisions/s per instance (empty = the instance family's default)", key=KEYS.dps,
                            persist_state=context.KEEP)
        b1, b2 = st.columns(2)
        submitted = b1.form_submit_button("Plan", type="primary")
        local = b2.form_submit_button("Plan a local run", help="for Run locally (podman, no AWS): the bucket and "
                                      "roles may stay empty")
    if not (submitted or local):
        return None, False
    return {"bucket": bucket, "role_arn": role, "model_path": model, "codebuild_role_arn": cb_role,
            "instance_type": cpu_type, "pools": pools.to_dict("records"),
            "autoscale_max": scale_max if scale_max > 1 else "", "decisions_per_second": dps}, local


def make_plan(db: Store, form: dict[str, Any], outside: tuple[str, str, str, str], local: bool, calibrated_sha: str) -> None:
    """Package and plan (every plan is in the audit log); the form's errors by field, else the plan to confirm."""
    st.session_state.pop(KEYS.outcome, None)  # a new plan: the last confirm's outcome is history (below)
    try:
        form = {**form, "model_path": deploy.model_for(form["model_path"], calibrated_sha)}
        with st.spinner(f"Packaging the model into {deploy.WORK} (local; its checksum goes into the plan)…"):
            planned = deploy.plan(db, form, replaces=st.session_state.get(KEYS.planned), local=local)
        st.session_state[KEYS.planned] = planned.to_state()
        st.session_state[KEYS.planned_for] = outside
        st.session_state[KEYS.pick] = planned.cfg.deployment_id  # Deployments below opens the plan just made
    except FormErrors as exc:
        st.session_state.pop(KEYS.planned, None)  # no plan from earlier settings stays confirmable
        for field, msg in exc.errors.items():
            st.error(f"**{FIELD_LABELS.get(field, field)}**: {md(msg)}")
    except (ValueError, OSError) as exc:
        st.session_state.pop(KEYS.planned, None)
        st.error(f"**Model**: cannot package it: {md(exc)}")


def plan_and_confirm(db: Store, endpoint_url: str | None, runtime_url: str | None, poll: float) -> None:
    planned = deploy.Planned.from_state(st.session_state[KEYS.planned])  # exactly what runs on confirm
    cfg, steps = planned.cfg, planned.steps
    st.subheader(f"Plan for `{cfg.endpoint_name}`")
    for line in planned.cost_lines():
        st.markdown(md(line))
    st.dataframe(pd.DataFrame([{"#": i, "call": f"{s.service}.{s.operation}", "what": s.description}
                               for i, s in enumerate(steps, 1)]), hide_index=True)
    with st.expander("Every call with its parameters (validated offline against botocore's service model)"):
        st.json([s.to_dict() for s in steps], expanded=False)
    st.download_button("Download the plan (JSON)", planned.plan_json().encode(),
                       file_name=f"{cfg.deployment_id}.plan.json", mime="application/json", key=KEYS.plan_dl)
    run_locally(db, planned)
    if planned.errors:
        st.error("The plan is invalid, nothing can run in AWS:\n\n" + "\n".join(f"- {md(e)}" for e in planned.errors))
        return
    ok = st.checkbox("I understand this creates billable AWS resources", key=KEYS.ack)
    if not st.button("Confirm and deploy", type="primary", disabled=not ok, key=KEYS.go):
        return
    bar = st.progress(0.0, text="starting…")
    log = st.status("Deploying…", expanded=True)

    def on_event(e: dict[str, Any]) -> None:
        if e.get("total") and e.get("index"):
            bar.progress(min(e["index"] / e["total"], 1.0), text=f"step {e['index']}/{e['total']}: {e['message']}")
        if e.get("phase") in ("done", "error", "package", "wait"):
            log.write(e["message"])

    try:
        out = deploy.apply(db, planned, deploy.executor(cfg.region, endpoint_url=endpoint_url, poll=poll,
                                                        on_event=on_event), runtime_url=runtime_url)
        outcome = ("success", f"`{md(cfg.endpoint_name)}` is {md(out['status']['status'])}; it is now a target in the "
                   "Playground and Compare pages.")
    except DeployError as exc:
        outcome = ("error", f"**Deployment `{cfg.deployment_id}` failed** (recorded below): {md(exc)}")
    st.session_state.pop(KEYS.planned, None)
    # kept for the next run, which draws the deployments (and the picker's status) from what was recorded
    st.session_state[KEYS.outcome] = outcome
    st.session_state[KEYS.pick] = cfg.deployment_id
    st.rerun()


def run_locally(db: Store, planned: deploy.Planned) -> None:
    """The same plan in the local SemIf container: the same model.tar.gz, extracted to /opt/ml/model,
    the same environment; then a SemIf target at 127.0.0.1."""
    cfg = planned.cfg
    runner = deploy.local_runner()
    why = ("Local mode runs the SemIf image only (the llama.cpp DLC cannot be pulled here)." if cfg.serving != "semif"
           else runner.unavailable())
    st.markdown("**Run locally** — this plan's model.tar.gz and environment in the SemIf image on this machine "
                "(podman), no AWS: then test the exact artifact on the Playground, Compare, Calibrate and Robustness.")
    if why:
        st.info(md(why))
        return
    if not st.button("Run locally", key=KEYS.local):
        return
    try:
        with st.spinner(f"Starting {runner.image} with {cfg.deployment_id}'s model.tar.gz…"):
            ep = deploy.run_local(db, planned, runner)
        outcome = ("success", f"`{md(cfg.endpoint_name)}` runs locally at {ep.url} (ready after {ep.ready_seconds:.1f} s); "
                   f"it is now the target `{md(deploy.local_target_name(cfg.endpoint_name))}`.")
    except DeployError as exc:
        outcome = ("error", f"**Local run of `{cfg.deployment_id}` failed** (recorded below): {md(exc)}")
    st.session_state[KEYS.outcome] = outcome
    st.session_state[KEYS.pick] = cfg.deployment_id
    st.rerun()


def deployments(db: Store, endpoint_url: str | None, poll: float) -> None:
    st.subheader("Deployments")
    live, failed = deploy.deployments(db)
    deps = live + failed
    cols = ("id", "path", "compute", "region", "status", "created_at", "updated_at")
    if live:
        st.dataframe(pd.DataFrame(live)[list(cols)], hide_index=True)
    else:
        st.caption("No deployment has run yet." + (" Plans and failed attempts are listed below." if failed else ""))
    if failed:
        with st.expander(f"Plans not deployed and failed attempts ({len(failed)})"):
            st.dataframe(pd.DataFrame(failed)[list(cols)], hide_index=True)
    if not deps:
        return
    by_id = {d["id"]: d for d in live + failed}
    pick = st.selectbox("Deployment", list(by_id), key=KEYS.pick,
                        format_func=lambda i: deploy.deployment_label(by_id[i]))
    dep = by_id[pick]
    if dep["status"] in ("planned", "superseded"):  # a plan that never ran created nothing to watch or destroy
        st.caption("This plan never ran: nothing was created in AWS.")
        st.markdown("**Audit log**")
        st.dataframe(pd.DataFrame(queries.audit_log(db, pick)), hide_index=True)
        return
    if dep["status"] == deploy.LOCAL:
        local_deployment(db, dep)
        return
    c1, c2 = st.columns(2)
    if c1.button("Refresh status", key=KEYS.refresh):
        try:
            st.json(deploy.executor(dep["region"], endpoint_url=endpoint_url, poll=poll).status(dep["endpoint_name"]))
        except DeployError as exc:
            st.error(md(exc))
    if dep["status"] == "failed":
        st.caption("This attempt failed (see the audit log): the steps before the failure may have created some "
                   "resources. Destroy removes whichever of them exist; it is safe when none do.")
    with c2.popover("Destroy"):
        st.write(f"Deletes endpoint, endpoint config and model of **{md(dep['endpoint_name'])}**. Type its name to confirm.")
        typed = st.text_input("Endpoint name", key=KEYS.confirm_name)
        if st.button("Destroy", type="primary", disabled=typed != dep["endpoint_name"], key=KEYS.destroy):
            try:
                deploy.destroy(db, dep["endpoint_name"], deploy.executor(dep["region"], endpoint_url=endpoint_url,
                                                                         poll=poll))
                st.rerun()
            except DeployError as exc:
                st.error(md(exc))
    st.markdown("**Audit log**")
    st.dataframe(pd.DataFrame(queries.audit_log(db, pick)), hide_index=True)


def local_deployment(db: Store, dep: Mapping[str, Any]) -> None:
    """A plan running in the local container: its state, Destroy (stop and remove it), the audit log."""
    runner = deploy.local_runner()
    c1, c2 = st.columns(2)
    if c1.button("Refresh status", key=KEYS.refresh):
        st.write(f"Container: **{md(runner.status(dep['endpoint_name']))}**")
    with c2.popover("Destroy"):
        st.write(f"Stops and removes the local container of **{md(dep['endpoint_name'])}** and its target.")
        if st.button("Stop and remove", type="primary", key=KEYS.destroy_local):
            try:
                deploy.destroy_local(db, dep["endpoint_name"], runner)
                st.rerun()
            except DeployError as exc:
                st.error(md(exc))
    st.markdown("**Audit log**")
    st.dataframe(pd.DataFrame(queries.audit_log(db, dep["id"])), hide_index=True)


def render() -> None:
    st.title("Deploy to SageMaker")
    db = resources.store()
    settings = WorkbenchSettings.from_env()
    endpoint_url, runtime_url, poll = settings.aws_endpoint_url, settings.aws_runtime_url, settings.deploy_poll
    if endpoint_url:
        st.info(f"AWS calls go to **{endpoint_url}** (SEMIF_AWS_ENDPOINT_URL), not to AWS.")
    st.caption("Credentials come from the normal AWS chain (AWS_PROFILE, environment, SSO); none are stored here.")
    outside = plan_form(db)
    if KEYS.outcome in st.session_state:  # the last confirm's outcome stays on screen until the next plan
        kind, text = st.session_state[KEYS.outcome]
        (st.success if kind == "success" else st.error)(text)
    if st.session_state.get(KEYS.planned):
        if st.session_state.get(KEYS.planned_for) != outside:
            st.warning("The serving path, compute, region or calibrated policy changed since the last plan: "
                       "press **Plan** again to see (and confirm) the plan for these settings.")
        else:
            plan_and_confirm(db, endpoint_url, runtime_url, poll)
    deployments(db, endpoint_url, poll)


if __name__ == "__main__":
    resources.run_page(render)
