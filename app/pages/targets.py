"""Targets: where decisions come from - the local engine, adapters, endpoints (no secrets stored)."""
import streamlit as st

from app import resources
from app.safe_text import md
from app.targets import KINDS, TargetError, validate_target_spec

st.title("Targets")
db = resources.store()
specs = resources.target_specs(db)
st.caption("Saved by name. API keys are never stored: a chat target names the environment variable (or "
           "Streamlit secret) that holds its key.")
for spec in specs:
    with st.container(border=True):
        c1, c2, c3 = st.columns([3, 1, 1])
        cfg = {k: v for k, v in spec["config"].items() if v}
        c1.markdown(f"**{md(spec['name'])}** · {KINDS.get(spec['kind'], spec['kind'])}  \n{md(cfg or 'shipped default model')}")
        if c2.button("Test connection", key=f"tg_test_{spec['name']}"):
            try:
                c1.success(resources.make_target(spec).test_connection())
            except TargetError as exc:
                c1.error(md(exc))
            except Exception as exc:  # a target must never take the page down
                c1.error(f"{type(exc).__name__}: {md(exc)}")
        if spec.get("created_at") and c3.button("Delete", key=f"tg_del_{spec['name']}"):
            db.delete_target(spec["name"])
            st.rerun()

st.subheader("Add a target")
kind = st.selectbox("Kind", list(KINDS), format_func=KINDS.get, key="tg_kind")
with st.form("tg_form"):
    name = st.text_input("Name", key="tg_name")
    config: dict = {}
    if kind == "local":
        config["model"] = st.text_input("GGUF path or shipped name (empty = shipped default)", key="tg_model")
    if kind in ("semif", "chat", "systemone"):
        config["url"] = st.text_input("Base URL", placeholder="http://127.0.0.1:8080", key="tg_url")
    if kind == "sagemaker":
        config["endpoint_name"] = st.text_input("Endpoint name", key="tg_endpoint")
        config["region"] = st.text_input("Region", "us-east-1", key="tg_region")
    if kind in ("chat", "systemone"):
        config["model"] = st.text_input("Model name sent in requests", "jev-latest" if kind == "systemone" else "default",
                                        key=f"tg_{kind}_model")
        config["api_key_env"] = st.text_input("Environment variable holding the API key (optional)", key="tg_key_env")
    add = st.form_submit_button("Save target", type="primary")
if add:
    errs = validate_target_spec(name, kind, config)
    if name in {s["name"] for s in specs}:
        errs["name"] = f"a target named {name!r} exists"
    for k, v in errs.items():
        st.error(f"**{k}**: {v}")
    if not errs:
        db.save_target(name, kind, {k: v.strip() for k, v in config.items() if isinstance(v, str)})
        st.rerun()
