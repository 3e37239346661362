"""The analyst's context across pages and reloads: the current policy, labeled set, run and saved
calibrated policy follow from page to page (session state) and sit in the URL (query parameters), so a
reload keeps them and a view can be linked - `/history?run=6` opens run 6, `/calibrate?policy=refund-check&set=3`
opens that policy on that set."""
from __future__ import annotations

from typing import Any, Callable, Final, Sequence

import streamlit as st

from app.ui.keys import CONTEXT

KEYS = CONTEXT  # session keys: ctx_policy, ctx_set, ...
NAMES = ("policy", "set", "run", "calibrated")  # what is carried, as URL parameters of the same names
# `persist_state=KEEP` on a widget: what the analyst typed survives a visit to another page (Streamlit drops the
# values of widgets a run does not draw - and the browser sends none from the page left)
KEEP: Final = "session"


def _parse(name: str, raw: Any) -> Any:
    if raw is None or raw == "":
        return None
    return int(raw) if name != "policy" and str(raw).isdigit() else str(raw)


def get(name: str) -> Any:
    """The context value: this session's, else the URL's (a reload or a shared link)."""
    if KEYS(name) in st.session_state:
        return st.session_state[KEYS(name)]
    return _parse(name, st.query_params.get(name))


def put(name: str, value: Any) -> None:
    """Remember a value for the other pages, and show it in the URL."""
    st.session_state[KEYS(name)] = value
    if value is None:
        st.query_params.pop(name, None)
    elif st.query_params.get(name) != str(value):
        st.query_params[name] = str(value)


def show_in_url() -> None:
    """Keep the URL in step with the context on every page (a page switch starts from a bare URL). A
    value the URL brings (a link, a reload) is adopted first, so the next page switch keeps it even when
    the page it opened never picked it up."""
    for name in NAMES:
        if KEYS(name) not in st.session_state and st.query_params.get(name) not in (None, ""):
            st.session_state[KEYS(name)] = _parse(name, st.query_params.get(name))
    for name in NAMES:
        value = st.session_state.get(KEYS(name))
        if value is not None and st.query_params.get(name) != str(value):
            st.query_params[name] = str(value)


def follow(key: str, name: str, options: Sequence[Any], fallback: Callable[[], Any] | None = None) -> None:
    """Before the picker `key` is drawn: let it show the context value when that is one of its options
    (else what it showed, else `fallback()`); the picker then reports changes with `on_change=changed(...)`."""
    want = get(name)
    if want in options:
        if st.session_state.get(key) != want:
            st.session_state[key] = want
    elif st.session_state.get(key) not in options and fallback is not None:
        st.session_state[key] = fallback()


def missing(name: str, options: Sequence[Any]) -> Any:
    """The context value when it is none of `options` (a link to a deleted run), else None."""
    value = get(name)
    return value if value is not None and value not in options else None


def changed(key: str, name: str) -> Callable[[], None]:
    """An on_change callback: the picker's new value becomes the context."""
    return lambda: put(name, st.session_state.get(key))
