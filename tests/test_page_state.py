"""Page keys: declared per page (app/ui/keys.py), the prefix makes the key, the default separator keeps the keys
the UI tests find widgets by; a name no page declares is an error, in the code (mypy, AttributeError) and in
the tests (every key a test names literally is one a page declares)."""
from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from app.ui import keys as declared
from app.ui.page_state import Key, PageKeys

ROOT = Path(__file__).resolve().parent.parent
PAGES = [v for v in vars(declared).values() if isinstance(v, PageKeys)]


class Demo(PageKeys):
    run = Key()
    run_pick = Key()


def test_declared_names_and_call_make_prefixed_keys():
    keys = Demo("cal")
    assert keys.run == "cal_run" and keys.run_pick == "cal_run_pick"
    assert keys("map", "yes", 3) == "cal_map_yes_3"
    assert Demo("calibrate", ".").run == "calibrate.run"
    assert Demo.declared() == ["run", "run_pick"]


def test_a_name_no_page_declares_is_an_error_not_a_new_key():
    with pytest.raises(AttributeError):
        Demo("cal").rn  # type: ignore[attr-defined]  # the typo mypy reports
    with pytest.raises(AttributeError):
        declared.CALIBRATE.run_pik  # type: ignore[attr-defined]


def test_owns_and_copy():
    keys = Demo("rb")
    assert keys.owns("rb_guard") and not keys.owns("rbx_guard") and not keys.owns("cal_run")
    assert copy.deepcopy(keys) == keys


def test_every_page_has_its_own_prefix_and_declares_what_it_reads():
    prefixes = [k.prefix for k in PAGES]
    assert len(prefixes) == len(set(prefixes)), prefixes
    assert declared.CALIBRATE.run_pick == "cal_run_pick" and declared.DEPLOY.prefix == "dep"
    assert sum(len(type(k).declared()) for k in PAGES) >= 100


# pages whose per-item keys are built from data, not from a literal name: the Policies editor's (one per field of a
# policy and view: app/ui/policy_editor.key) and the Targets form's (one per field of a target kind: registry.KINDS)
FROM_DATA = {"pol": "policy fields x views", "tg": "a target kind's form fields"}


HELPERS = {m for p in sorted((ROOT / "app" / "ui").glob("*.py"))  # suffixes a shared UI helper adds to the key it is given
           for m in re.findall(r'f"\{key\}_([a-z0-9_]+)"', p.read_text())}


def per_item_bases() -> dict[str, set[str]]:
    """prefix -> the first part of the keys made per item (`KEYS("map", oid)`), read from the app's source, and
    of the keys a shared UI helper makes from a page's prefix (`f"{key}_gate"` in app/ui/)."""
    bases: dict[str, set[str]] = {}
    helpers = HELPERS
    source = "\n".join(p.read_text() for p in sorted((ROOT / "app").rglob("*.py")))
    for keys in PAGES:
        const = next(n for n, v in vars(declared).items() if v is keys)
        names = {const} | set(re.findall(rf"^(\w+) = {const}\b", source, re.M))
        found = set()
        for name in names:
            found |= set(re.findall(rf"\b{name}\(\s*\"([a-z0-9_]+)\"", source))
        bases[keys.prefix] = found | helpers
    return bases


def undeclared(literals: set[str], bases: dict[str, set[str]]) -> list[str]:
    """The literal keys (a page's prefix + '_' + a name) that no page declares, as a name or a per-item base."""
    out = []
    by_prefix = {k.prefix: k for k in PAGES}
    for lit in sorted(literals):
        prefix, _, name = lit.partition("_")
        keys = by_prefix.get(prefix)
        if keys is None or prefix in FROM_DATA:
            continue
        names = type(keys).declared()
        if name in names or any(name == b or name.startswith(b + "_") for b in bases[prefix]) \
                or any(name == f"{d}_{h}" for d in names for h in HELPERS):  # a helper given a declared key
            continue
        out.append(lit)
    return out


def test_every_key_a_test_names_is_declared_by_its_page():
    prefixes = "|".join(re.escape(k.prefix) for k in PAGES)
    pattern = re.compile(rf"""["']((?:{prefixes})_[a-z0-9_]+)["']""")
    literals = {m for p in sorted((ROOT / "tests").glob("test_*.py")) if p.name != Path(__file__).name
                for m in pattern.findall(p.read_text())}
    assert len(literals) >= 50, "the tests name pages' keys: the pattern finds them"
    wrong = undeclared(literals, per_item_bases())
    assert not wrong, f"tests name keys no page declares (app/ui/keys.py): {wrong}"


def test_the_literal_check_fails_on_a_misspelt_key():
    bases = per_item_bases()
    assert undeclared({"cal_run_pik", "dep_nope", "hist_drift_kind"}, bases) == ["cal_run_pik", "dep_nope", "hist_drift_kind"]
    assert undeclared({"cal_run_pick", "hist_open", "hist_drift_kinds"}, bases) == []
