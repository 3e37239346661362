"""Which saved version of a policy this session's editor shows (session state, no widgets): the
Policies page keeps a draft across another session's save, and refuses a save from a stale view."""
from __future__ import annotations

from typing import Any, Iterable, MutableMapping

VIEW_KEY = "pol_view"  # session state: (policy id, the saved policy the editor was built from)


def editor_view(state: MutableMapping[str, Any] | Any, pick: str | None, saved: dict | None) -> tuple[dict | None, str | None]:
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
