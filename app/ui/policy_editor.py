"""Which saved version of a policy this session's editor shows, and the draft its widgets hold (session
state, no widgets): the Policies page keeps a draft across another session's save, refuses a save from
a stale view, and knows when the draft differs from the saved version."""
from __future__ import annotations

from typing import Any, Iterable, Mapping, MutableMapping

from app.service.policies import changed_fields, policy_json

VIEW_KEY = "pol_view"  # session state: (policy id, the saved policy the editor was built from)
SHOWN_KEY = "pol_shown"  # session state: (policy id or NEW, the view key) the editor drew last
NEW = "__new__"
EMPTY: dict[str, Any] = {"id": "", "name": "", "question": "", "options": [{"id": "", "description": ""}] * 2,
                         "examples": [], "notes": "", "readout": "", "debias": "", "version": 0}


def editor_view(state: MutableMapping[str, Any] | Any, pick: str | None, saved: Mapping[str, Any] | None) -> tuple[Mapping[str, Any] | None, str | None]:
    """(the saved policy this session's editor shows, a note when it is no longer the saved one).

    The editor shows the version this session loaded - kept in `state` - not whatever is saved now:
    its widgets (keyed by that version) keep a draft across another session's save, and the draft's
    save is checked against that version (and refused when it is stale, instead of being silently
    dropped). Picking a policy loads what is saved; `pick=None` is a new policy."""
    shown = state.get(VIEW_KEY)
    if pick is None:
        state.pop(VIEW_KEY, None)
        return None, None
    if not shown or shown[0] != pick:
        if saved is None:
            state.pop(VIEW_KEY, None)
            return None, None
        state[VIEW_KEY] = shown = (pick, saved)
    view = shown[1]
    loaded = view.get("version") or 0
    if saved is None:
        return view, (f"This policy was deleted by another page or session after this view loaded version {loaded}: "
                      "a save from here is refused. To keep what is on screen, copy it into a new policy.")
    if (saved.get("version") or 0) != loaded:
        return view, (f"Version {saved.get('version')} was saved by another page or session after this view loaded "
                      f"version {loaded}: a save from here is refused. Load the newer version (what is typed here "
                      "and not saved is dropped), then apply your change.")
    return view, None


def kept_deleted(state: MutableMapping[str, Any] | Any, saved_ids: Iterable[str]) -> str | None:
    """The id of the policy this session is viewing when it was deleted meanwhile (it stays in the
    list while its view is open, so a draft is not switched away from silently)."""
    shown = state.get(VIEW_KEY)
    return shown[0] if shown and shown[0] not in saved_ids else None


# The editor's widgets are plain widgets (no st.form): their values are in session state on every
# rerun, so the page knows when the draft differs from the saved version it was built on. Every key
# carries the view (`<policy id>_v<version>`): another session's save never overwrites a draft here.
FIELDS = ("name", "question", "readout", "debias", "guard", "notes", "json")
ROWS = {"options": ("id", "description"), "examples": ("state", "option_id")}


def key(field: str, view: str, row: int | None = None) -> str:
    """The widget key of one field (a row's column: `field` is e.g. "options.id") in this view."""
    base = f"pol_{field.replace('.', '_')}_{view}"
    return base if row is None else f"{base}_{row}"


def _rows_key(kind: str, view: str) -> str:
    return f"pol_rows_{kind}_{view}"


def row_ids(state: MutableMapping[str, Any] | Any, kind: str, view: str, saved: Mapping[str, Any]) -> list[int]:
    """The rows (of "options" or "examples") the editor shows, as stable ids: the saved rows are
    0..n-1, an added row takes the next unused id, a removed one leaves the list (so the other rows
    keep their widgets and what was typed in them). Rebuilt from the saved policy when the view's
    widgets are gone (the view was discarded or saved: `forget`)."""
    rk = _rows_key(kind, view)
    if rk not in state or key("name", view) not in state:
        n = len(saved.get(kind) or [])
        state[rk] = {"ids": list(range(n)), "next": n}
    return list(state[rk]["ids"])


def add_row(state: MutableMapping[str, Any] | Any, kind: str, view: str) -> None:
    rows = state[_rows_key(kind, view)]
    state[_rows_key(kind, view)] = {"ids": [*rows["ids"], rows["next"]], "next": rows["next"] + 1}


def remove_row(state: MutableMapping[str, Any] | Any, kind: str, view: str, row: int) -> None:
    rows = state[_rows_key(kind, view)]
    state[_rows_key(kind, view)] = {"ids": [r for r in rows["ids"] if r != row], "next": rows["next"]}
    for col in ROWS[kind]:
        state.pop(key(f"{kind}.{col}", view, row), None)


def option_ids(state: MutableMapping[str, Any] | Any, view: str, saved: Mapping[str, Any]) -> list[str]:
    """The option ids as the draft's option rows hold them now (blank and repeated ids left out)."""
    ids = [str(state.get(key("options.id", view, r), row_default(saved, "options", r, "id")) or "").strip()
           for r in row_ids(state, "options", view, saved)]
    return list(dict.fromkeys(i for i in ids if i))


def rename_option(state: MutableMapping[str, Any] | Any, view: str, saved: Mapping[str, Any], row: int, old: str) -> None:
    """on_change of an option's id: the examples labelled with the old id take the new one (unless another
    option row still has the old id), so a rename never leaves examples behind."""
    new, old = str(state.get(key("options.id", view, row)) or "").strip(), old.strip()
    if not old or not new or old == new or old in option_ids(state, view, saved):
        return
    for r in row_ids(state, "examples", view, saved):
        k = key("examples.option_id", view, r)
        if str(state.get(k, row_default(saved, "examples", r, "option_id")) or "") == old:
            state[k] = new


def row_default(saved: Mapping[str, Any], kind: str, row: int, col: str) -> str:
    """What a row's cell starts as: the saved row's value, empty for an added row."""
    rows = saved.get(kind) or []
    return str((rows[row] or {}).get(col) or "") if row < len(rows) else ""


def draft(state: MutableMapping[str, Any] | Any, view: str, saved: Mapping[str, Any], json_text: str) -> dict[str, Any]:
    """The policy as this view's widgets hold it now (a widget not drawn yet: the saved value), with
    the JSON view's text under "json" (`json_text` is what that view starts with)."""
    out: dict[str, Any] = {"id": saved.get("id") or None}
    for f in FIELDS:
        start = json_text if f == "json" else (saved.get(f) or "")
        out[f] = state.get(key(f, view), start)
    rows_exist = key("name", view) in state
    for kind, cols in ROWS.items():
        ids = row_ids(state, kind, view, saved) if rows_exist else list(range(len(saved.get(kind) or [])))
        out[kind] = [{c: state.get(key(f"{kind}.{c}", view, r), row_default(saved, kind, r, c)) for c in cols}
                     for r in ids]
    return out


def json_start(pick: str, saved: Mapping[str, Any]) -> str:
    """What the JSON tab starts with: the saved policy's JSON (empty for a new policy)."""
    return policy_json(saved) if pick != NEW else ""


def _saved_of(state: MutableMapping[str, Any] | Any, shown: tuple[str, str]) -> Mapping[str, Any] | None:
    if shown[0] == NEW:
        return EMPTY
    view = state.get(VIEW_KEY)
    return view[1] if view and view[0] == shown[0] else None


def unsaved(state: MutableMapping[str, Any] | Any) -> list[str]:
    """The fields where the draft the editor drew last differs from the saved version it was built on."""
    shown = state.get(SHOWN_KEY)
    saved = _saved_of(state, shown) if shown else None
    if not shown or saved is None:
        return []
    pick, view = shown
    return changed_fields(draft(state, view, saved, json_start(pick, saved)), saved)


def unsaved_name(state: MutableMapping[str, Any] | Any) -> str | None:
    """The name of the policy whose draft is not saved ("a new policy" for one never saved), else None."""
    if not unsaved(state):
        return None
    shown = state[SHOWN_KEY]
    saved = _saved_of(state, shown) or {}
    return "a new policy" if shown[0] == NEW else str(saved.get("name") or shown[0])


def forget(state: MutableMapping[str, Any] | Any, view: str) -> None:
    """Drop this view's draft (its widgets' values and rows), e.g. when the analyst discards it."""
    for kind, cols in ROWS.items():
        rows = state.get(_rows_key(kind, view)) or {"ids": []}
        for r in rows["ids"]:
            for c in cols:
                state.pop(key(f"{kind}.{c}", view, r), None)
        state.pop(_rows_key(kind, view), None)
    for f in FIELDS:
        state.pop(key(f, view), None)
