"""Targets: where decisions come from - local models, adapters, endpoints (no secrets stored)."""
import streamlit as st

from adapter.catalog import SHIPPED
from app.ui import resources
from app.ui.safe_text import md
from app.core.store import Exists
from app.targets.kinds import KEY_PREFIX, KINDS, TargetError, validate_target_spec

OWN_GGUF = "your own GGUF file…"


def describe(spec: dict) -> str:
    """'model: qwen2.5-coder-0.5b · url: …' - a saved config as a person reads it."""
    cfg = {k: v for k, v in (spec.get("config") or {}).items() if v not in ("", None)}
    if spec["kind"] == "local" and not cfg.get("model"):
        return f"model: the default ({resources.engines().describe(None)})"
    return " · ".join(f"{k}: {v}" for k, v in cfg.items())


def target_card(spec: dict, db) -> None:
    name = spec["name"]
    with st.container(border=True):
        c1, c2, c3 = st.columns([4, 1, 1])
        c1.markdown(f"**{md(name)}** · {KINDS.get(spec['kind'], spec['kind'])}  \n{md(describe(spec))}")
        if c2.button("Test", key=f"tg_test_{name}", help="test the connection (for a local model: load it)"):
            try:
                st.session_state[f"tg_result_{name}"] = ("ok", resources.make_target(spec).test_connection())
            except TargetError as exc:
                st.session_state[f"tg_result_{name}"] = ("error", str(exc))
            except Exception as exc:  # a target must never take the page down
                st.session_state[f"tg_result_{name}"] = ("error", f"{type(exc).__name__}: {exc}")
        outcome = st.session_state.get(f"tg_result_{name}")  # each target keeps its own last test result
        if outcome:
            (c1.success if outcome[0] == "ok" else c1.error)(md(outcome[1]))
        if spec.get("created_at") and c3.button("Delete", key=f"tg_del_{name}"):
            db.delete_target(name)
            st.session_state.pop(f"tg_result_{name}", None)
            st.rerun()


def add_form(db, specs: list[dict]) -> None:
    st.subheader("Add a target")
    kind = st.selectbox("Kind", list(KINDS), format_func=KINDS.get, key="tg_kind")
    n = st.session_state.get("tg_form_n", 0)  # a new form after each save: the next one starts empty
    choice = None
    if kind == "local":  # outside the form, so that the path field shows only for your own file
        offered = [m for m in SHIPPED if SHIPPED[m].offered]
        choice = st.selectbox("Model", offered + [OWN_GGUF], key=f"tg_model_pick_{n}",
                              format_func=lambda m: m if m == OWN_GGUF else f"{SHIPPED[m].title} ({SHIPPED[m].size_text})")
    with st.form(f"tg_form_{n}"):
        name = st.text_input("Name", key=f"tg_name_{n}")
        config: dict = {}
        if kind == "local":
            if choice == OWN_GGUF:
                config["model"] = st.text_input("GGUF path", key=f"tg_model_{n}",
                                                placeholder="~/models/my-model.gguf").strip()
            else:
                config["model"] = choice
        if kind in ("semif", "chat", "systemone"):
            config["url"] = st.text_input("Base URL", placeholder="http://127.0.0.1:8080", key=f"tg_url_{n}")
        if kind == "sagemaker":
            config["endpoint_name"] = st.text_input("Endpoint name", key=f"tg_endpoint_{n}")
            config["region"] = st.text_input("Region", "us-east-1", key=f"tg_region_{n}")
        if kind == "sagemaker-batch":
            config["model_name"] = st.text_input("SageMaker model to reuse (a deployed SemIf model)", key=f"tg_smmodel_{n}")
            config["bucket"] = st.text_input("S3 bucket for the JSON Lines input and results", key=f"tg_bucket_{n}")
            config["region"] = st.text_input("Region", "us-east-1", key=f"tg_bregion_{n}")
            config["instance_type"] = st.text_input("Instance type", "ml.c5.xlarge", key=f"tg_itype_{n}")
            config["instance_count"] = st.text_input("Instance count", "1", key=f"tg_icount_{n}")
        if kind in ("chat", "systemone"):
            config["model"] = st.text_input("Model name sent in requests", "jev-latest" if kind == "systemone" else "default",
                                            key=f"tg_{kind}_model_{n}")
        if kind in ("semif", "chat", "systemone"):
            config["api_key_env"] = st.text_input(
                f"API key: the name of an environment variable starting with {KEY_PREFIX}, or of a Streamlit secret "
                "(optional)", key=f"tg_key_env_{n}", placeholder=f"{KEY_PREFIX}MY_SERVER",
                help=f"Only {KEY_PREFIX}* variables and Streamlit secrets can be sent as a target's key, so that no "
                     "other secret of this machine (AWS_SECRET_ACCESS_KEY, tokens) can reach a target's URL.")
        if kind != "local":
            config["hourly_usd"] = st.text_input("Hourly price in USD (optional, for cost per 1,000 decisions)",
                                                 key=f"tg_price_{n}")
        add = st.form_submit_button("Save target", type="primary")
    if add:
        config = {k: v.strip() for k, v in config.items() if isinstance(v, str)}
        errs = validate_target_spec(name, kind, config, resources.secrets())
        if config.get("hourly_usd"):
            try:
                float(config["hourly_usd"])
            except ValueError:
                errs["hourly_usd"] = "a number of dollars per hour, e.g. 1.41"
        if name in {s["name"] for s in specs}:
            errs["name"] = f"a target named {name!r} exists"
        for k, v in errs.items():
            st.error(f"**{k}**: {md(v)} (nothing was saved)")
        if not errs:
            try:
                db.add_target(name, kind, {k: v for k, v in config.items() if v})
            except Exists as exc:  # taken by another session since this page was drawn
                st.error(f"**name**: {md(exc)} (nothing was saved)")
                return
            st.session_state["tg_saved"], st.session_state["tg_form_n"] = name, n + 1
            st.rerun()


def render() -> None:
    st.title("Targets")
    db = resources.store()
    specs = resources.target_specs(db)
    if st.session_state.get("tg_saved"):
        st.success(f"Saved target **{md(st.session_state.pop('tg_saved'))}**")
    st.caption("Saved by name. API keys are never stored: a SemIf, chat or /v1/systemone target names the "
               f"environment variable ({KEY_PREFIX}*, no other) or the Streamlit secret that holds its key. "
               "Local models load on first use; at most "
               f"{resources.engines().max_loaded} stay loaded (SEMIF_MAX_LOADED_MODELS).")
    for spec in specs:
        target_card(spec, db)
    add_form(db, specs)


if __name__ == "__main__":
    resources.run_page(render)
