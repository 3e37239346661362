"""PageKeys: the prefix makes the key, the default separator keeps the keys the UI tests find widgets by."""
import copy

from app.ui.page_state import PageKeys


def test_attribute_and_call_make_prefixed_keys():
    keys = PageKeys("cal")
    assert keys.run == "cal_run"
    assert keys.run_pick == "cal_run_pick"
    assert keys("map", "yes", 3) == "cal_map_yes_3"
    assert PageKeys("calibrate", ".").run == "calibrate.run"


def test_owns_and_copy():
    keys = PageKeys("rb")
    assert keys.owns("rb_guard") and not keys.owns("rbx_guard") and not keys.owns("cal_run")
    assert copy.deepcopy(keys) == keys
