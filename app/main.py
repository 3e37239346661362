"""SemIf Workbench: navigation only. Pages live in app/views/ (each a render() function); what they do is in app/service.

Navigation sits at the top: on a narrow window (800 px) a sidebar would take a third of the width."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

# the favicon is a file served by this workbench: a ":material/..." page icon is fetched by the browser from a
# public font host (fonts.gstatic.com), and the workbench must work - and stay silent - offline
st.set_page_config(page_title="SemIf Workbench", page_icon=ROOT / "app" / "icon.png", layout="wide",
                   initial_sidebar_state="collapsed")
from app.ui import context, policy_editor, tasks  # noqa: E402
from app.ui.safe_text import md  # noqa: E402

HERE = Path(__file__).resolve().parent / "views"
page = st.navigation({
    "Decide": [st.Page(HERE / "playground.py", title="Playground", icon=":material/target:", default=True),
               st.Page(HERE / "compare.py", title="Compare", icon=":material/compare_arrows:"),
               st.Page(HERE / "order_check.py", title="Order check", icon=":material/swap_vert:"),
               st.Page(HERE / "robustness.py", title="Robustness", icon=":material/shield:"),
               st.Page(HERE / "history.py", title="History", icon=":material/history:")],
    "Calibrate & ship": [st.Page(HERE / "calibrate.py", title="Calibrate", icon=":material/tune:"),
                         st.Page(HERE / "review.py", title="Review queue", icon=":material/rate_review:"),
                         st.Page(HERE / "deploy.py", title="Deploy", icon=":material/cloud_upload:")],
    "Set up": [st.Page(HERE / "policies.py", title="Policies", icon=":material/description:"),
               st.Page(HERE / "targets.py", title="Targets", icon=":material/hub:")],
}, position="top")
if page.url_path != "policies" and (name := policy_editor.unsaved_name(st.session_state)):  # a draft waits there
    st.info(f"Unsaved changes to {md(name)} wait on the Policies page.", icon=":material/edit:")
tasks.panel(page.url_path)  # on every page: what runs in the background, with its progress and a Stop
context.show_in_url()  # the current policy, set, run in the URL: a reload keeps them, a view can be linked
page.run()
