"""The Policies editor as a state machine over session state (no widgets, no Streamlit): which saved
version the editor shows, the draft its widgets hold, and the transitions - pick, ask before leaving a
draft, keep editing, discard, save (refused when stale, nothing already saved lost), reload, delete.
`editor(...)` says what the page draws on this run as one frozen `Editor`; the page draws only that.

The session keys are the ones below (the page's tests read `pol_pick` and the widget keys of `key()`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterable, Literal, Mapping, MutableMapping

from app.core.records import Policy as PolicyRecord
from app.core.store import StaleEdit
from app.ui.keys import POLICIES
from app.service.policies import changed_fields, parse_policy_json, policy_json, validate_policy, version_to_save

State = MutableMapping[Any, Any]  # session state (Streamlit's proxy), a dict in the tests
KEYS = POLICIES  # the Policies page's session keys
VIEW_KEY = KEYS.view  # (policy id, the saved policy the editor was built from)
SHOWN_KEY = KEYS.shown  # (policy id or NEW, the view key) the editor drew last
PICK_KEY = KEYS.pick  # the policy picker's widget key: the policy (or NEW) the editor is on
NEXT_KEY = KEYS.next  # the pick to apply on the next run after a save or delete (nothing unsaved is left)
OPEN_KEY = KEYS.open  # a copy or template just added: open it, asking first when a draft is unsaved
PENDING_KEY = KEYS.pending  # the pick asked for while the draft had unsaved changes (the page asks)
SAVED_KEY = KEYS.saved  # the name of the policy just saved (a toast on the next run)
NEW = "__new__"
EMPTY: dict[str, Any] = {"id": "", "name": "", "question": "", "options": [{"id": "", "description": ""}] * 2,
                         "examples": [], "notes": "", "readout": "", "debias": "", "version": 0}


def editor_view(state: State, pick: str | None, saved: Mapping[str, Any] | None) -> tuple[Mapping[str, Any] | None, str | None]:
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


def kept_deleted(state: State, saved_ids: Iterable[str]) -> str | None:
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
    base = KEYS(field.replace('.', '_'), view)
    return base if row is None else KEYS(field.replace('.', '_'), view, row)


def _rows_key(kind: str, view: str) -> str:
    return KEYS("rows", kind, view)


def row_ids(state: State, kind: str, view: str, saved: Mapping[str, Any]) -> list[int]:
    """The rows (of "options" or "examples") the editor shows, as stable ids: the saved rows are
    0..n-1, an added row takes the next unused id, a removed one leaves the list (so the other rows
    keep their widgets and what was typed in them). Rebuilt from the saved policy when the view's
    widgets are gone (the view was discarded or saved: `forget`)."""
    rk = _rows_key(kind, view)
    if rk not in state or key("name", view) not in state:
        n = len(saved.get(kind) or [])
        state[rk] = {"ids": list(range(n)), "next": n}
    return list(state[rk]["ids"])


def add_row(state: State, kind: str, view: str) -> None:
    rows = state[_rows_key(kind, view)]
    state[_rows_key(kind, view)] = {"ids": [*rows["ids"], rows["next"]], "next": rows["next"] + 1}


def remove_row(state: State, kind: str, view: str, row: int) -> None:
    rows = state[_rows_key(kind, view)]
    state[_rows_key(kind, view)] = {"ids": [r for r in rows["ids"] if r != row], "next": rows["next"]}
    for col in ROWS[kind]:
        state.pop(key(f"{kind}.{col}", view, row), None)


def option_ids(state: State, view: str, saved: Mapping[str, Any]) -> list[str]:
    """The option ids as the draft's option rows hold them now (blank and repeated ids left out)."""
    ids = [str(state.get(key("options.id", view, r), row_default(saved, "options", r, "id")) or "").strip()
           for r in row_ids(state, "options", view, saved)]
    return list(dict.fromkeys(i for i in ids if i))


def rename_option(state: State, view: str, saved: Mapping[str, Any], row: int, old: str) -> None:
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


def draft(state: State, view: str, saved: Mapping[str, Any], json_text: str) -> dict[str, Any]:
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


def _saved_of(state: State, shown: tuple[str, str]) -> Mapping[str, Any] | None:
    if shown[0] == NEW:
        return EMPTY
    view = state.get(VIEW_KEY)
    return view[1] if view and view[0] == shown[0] else None


def unsaved(state: State) -> list[str]:
    """The fields where the draft the editor drew last differs from the saved version it was built on."""
    shown = state.get(SHOWN_KEY)
    saved = _saved_of(state, shown) if shown else None
    if not shown or saved is None:
        return []
    pick, view = shown
    return changed_fields(draft(state, view, saved, json_start(pick, saved)), saved)


def unsaved_name(state: State) -> str | None:
    """The name of the policy whose draft is not saved ("a new policy" for one never saved), else None."""
    if not unsaved(state):
        return None
    shown = state[SHOWN_KEY]
    saved = _saved_of(state, shown) or {}
    return "a new policy" if shown[0] == NEW else str(saved.get("name") or shown[0])


def forget(state: State, view: str) -> None:
    """Drop this view's draft (its widgets' values and rows), e.g. when the analyst discards it."""
    for kind, cols in ROWS.items():
        rows = state.get(_rows_key(kind, view)) or {"ids": []}
        for r in rows["ids"]:
            for c in cols:
                state.pop(key(f"{kind}.{c}", view, r), None)
        state.pop(_rows_key(kind, view), None)
    for f in FIELDS:
        state.pop(key(f, view), None)


# -- the state machine ------------------------------------------------------------------------------
Mode = Literal["clean", "draft", "pending", "stale"]


def errors_key(pick: str) -> str:
    """Where a refused save's errors wait for the editor of `pick` (field -> message)."""
    return KEYS("errors", pick)


@dataclass(frozen=True)
class Editor:
    """What the editor shows on this run: the page lays these out and decides nothing."""
    pick: str  # a saved policy's id, or NEW
    saved: Mapping[str, Any]  # the saved version the view was built on (EMPTY for a new policy)
    changed: tuple[str, ...]  # the fields where the draft differs from it ("json": the JSON tab)
    pending: str | None  # the pick asked for while the draft is unsaved: the page asks before switching
    stale: str | None  # why a save from this view is refused (another session saved or deleted the policy)
    errors: Mapping[str, str]  # why the last save was refused, by field ("version": the view is stale)

    @property
    def version(self) -> int:
        return int(self.saved.get("version") or 0)

    @property
    def view(self) -> str:
        """The widgets' key suffix: the version this view loaded (this session's save makes fresh ones)."""
        return f"{self.pick}_v{self.version}"

    @property
    def editing(self) -> str | None:
        """The saved policy's id, None for a new one."""
        return None if self.pick == NEW else self.pick

    @property
    def mode(self) -> Mode:
        if self.stale:
            return "stale"
        if self.pending is not None:
            return "pending"
        return "draft" if self.changed else "clean"


def choices(state: State, saved_ids: Collection[str], wanted: str | None) -> list[str]:
    """Before the picker is drawn: apply the pick asked for since the last run (or ask first: `ask_or_switch`),
    open the other pages' policy `wanted` when nothing is picked yet; the picker's options (NEW first,
    a policy deleted meanwhile kept while its view is open)."""
    if wanted in saved_ids and PICK_KEY not in state:
        state[PICK_KEY] = wanted
    ask_or_switch(state)
    deleted = kept_deleted(state, saved_ids) if state.get(PICK_KEY) != NEW else None
    ids = [NEW, *saved_ids, *([deleted] if deleted else [])]
    if state.get(PICK_KEY) not in ids:
        state[PICK_KEY] = ids[1] if len(ids) > 1 else NEW
    return ids


def ask_or_switch(state: State) -> None:
    """Apply the selection asked for since the last run - unless the editor holds unsaved changes: then
    the draft stays, and the pick waits in PENDING_KEY (Discard changes and open X / Keep editing)."""
    forced = NEXT_KEY in state  # after a save or a delete: nothing unsaved is left behind
    if forced:
        state[PICK_KEY] = state.pop(NEXT_KEY)
    elif OPEN_KEY in state:  # a copy or a template was added: open it, the same way as a pick
        state[PICK_KEY] = state.pop(OPEN_KEY)
    shown = state.get(SHOWN_KEY)
    if forced or not shown or state.get(PICK_KEY) == shown[0]:
        return
    if unsaved(state):
        state[PENDING_KEY] = state.get(PICK_KEY)
        state[PICK_KEY] = shown[0]


def editor(state: State, pick: str, saved_policies: Mapping[str, Mapping[str, Any]],
           ids: Collection[str]) -> Editor:
    """After the picker: the editor of `pick` on this run (the version its view loaded, the draft's changes,
    a pending switch, a stale note, the last refused save's errors); forgets what no longer applies."""
    view, stale = editor_view(state, None if pick == NEW else pick, saved_policies.get(pick))
    ed = Editor(pick, view or EMPTY, (), None, stale, {})
    state[SHOWN_KEY] = (pick, ed.view)
    changed = tuple(changed_fields(draft(state, ed.view, ed.saved, json_start(pick, ed.saved)), ed.saved))
    ek = errors_key(pick)
    if not changed and "version" not in state.get(ek, {}):
        state.pop(ek, None)  # the draft is the saved policy again: its old errors no longer apply
    pending = state.get(PENDING_KEY)
    if pending is not None and (pending == pick or pending not in ids or not changed):
        state.pop(PENDING_KEY)  # nothing left to ask about
        pending = None
    return Editor(pick, ed.saved, changed, pending, stale, dict(state.get(ek, {})))


def new_policy(state: State) -> None:
    """New policy: asked for like a pick (`ask_or_switch` asks first when the draft is unsaved)."""
    state[PICK_KEY] = NEW


def keep_editing(state: State) -> None:
    state.pop(PENDING_KEY, None)


def discard_and_open(state: State, view: str, pending: str) -> None:
    """Drop the draft, open the pick that waited."""
    forget(state, view)
    state.pop(PENDING_KEY, None)
    state.pop(SHOWN_KEY, None)
    state[PICK_KEY] = pending


def reload(state: State, ed: Editor) -> None:
    """A stale view: load the newer saved version (the draft here is dropped: the analyst asked)."""
    state.pop(VIEW_KEY, None)
    state.pop(errors_key(ed.pick), None)
    forget(state, ed.view)


def opened(state: State, new_id: str) -> None:
    """A copy or template was saved: open it next (asking first when the draft is unsaved)."""
    state[OPEN_KEY] = new_id


def deleted(state: State) -> None:
    """The policy shown was deleted: the next run opens the first policy left."""
    state.pop(VIEW_KEY, None)
    state[NEXT_KEY] = None


def just_saved(state: State) -> str | None:
    """The name of the policy saved on the last run (once: a toast), else None."""
    return state.pop(SAVED_KEY, None) or None


Save = Callable[[Mapping[str, Any], int], PolicyRecord]  # (validated policy, expected version) -> saved
Taken = Callable[[str, "str | None", Collection[str]], dict[str, str]]  # (id, editing, saved ids) -> field: why not


def submit(state: State, ed: Editor, via: Literal["form", "json"], saved_ids: Collection[str],
           save: Save, taken: Taken) -> PolicyRecord | None:
    """Save the draft (the Form's fields, or the JSON tab's text) against the version the view was built on;
    `taken` says why a valid policy's id may not be saved from here (policies.id_taken, for this `via`).
    Saved: the next run opens it from what was saved (both views rebuilt) and says so. Refused - invalid,
    an id another policy has, or stale (StaleEdit: another session saved or deleted it) - the errors wait
    for the editor, and the draft stays on screen: nothing typed and nothing already saved is lost."""
    data = draft(state, ed.view, ed.saved, json_start(ed.pick, ed.saved))
    text = str(data.pop("json") or "")
    clean, errs = validate_policy(data) if via == "form" else parse_policy_json(text)
    if clean and (why := taken(clean["id"], ed.editing, saved_ids)):  # another policy's id
        errs, clean = why, None
    if not clean:
        state[errors_key(ed.pick)] = errs
        return None
    try:
        saved = save(clean, version_to_save(clean["id"], ed.editing, ed.version))
    except StaleEdit as exc:
        state[errors_key(ed.pick)] = {"version": str(exc)}
        return None
    state[errors_key(ed.pick)] = {}
    state.pop(PENDING_KEY, None)
    forget(state, ed.view)  # saved: the view of the new version starts from what was saved
    state[VIEW_KEY] = (saved["id"], saved)
    state[NEXT_KEY] = clean["id"]
    state[SAVED_KEY] = clean["name"]
    return saved
