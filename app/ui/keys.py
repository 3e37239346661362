"""Every page's session and widget keys, declared once: `KEYS.name` is "<prefix>_name", and a name a page
does not declare is a mypy error (and an AttributeError), not a new key made silently. Pages and tests read
the same declarations (tests/test_page_state.py checks that every key a test names literally is declared).

Add a key: one `name = Key()` line in its page's class. A key per item (one per policy or row) is
`KEYS(name, item)`, under the same prefix."""
from __future__ import annotations

from app.ui.page_state import Key, PageKeys


class CalibrateKeys(PageKeys):
    """The Calibrate page's keys (cal_*)."""
    candidates = Key()
    candidates_csv = Key()
    ci_width = Key()
    col_label = Key()
    col_state = Key()
    compare = Key()
    conf = Key()
    conf_after = Key()
    corrections = Key()
    cov = Key()
    del_for = Key()
    del_pick = Key()
    del_set = Key()
    download = Key()
    examples = Key()
    fallback = Key()
    gate = Key()
    guard = Key()
    head = Key()
    head_sources = Key()
    manual = Key()
    max_rows = Key()
    older = Key()
    outcome = Key()
    per_option = Key()
    policy = Key()
    register = Key()
    registered = Key()
    rel = Key()
    run = Key()
    run_pick = Key()
    save = Key()
    saved = Key()
    set = Key()
    set_for = Key()
    sets_box = Key()
    ship = Key()
    sources = Key()
    sources_chart = Key()
    sources_csv = Key()
    stop_at = Key()
    target_acc = Key()
    targets = Key()
    task = Key()
    up_for = Key()
    up_policy = Key()
    upload = Key()
    variants = Key()


CALIBRATE = CalibrateKeys("cal")


class CompareKeys(PageKeys):
    """The Compare page's keys (cmp_*)."""
    agree = Key()
    box = Key()
    dl = Key()
    drift = Key()
    drift_a = Key()
    drift_b = Key()
    ecdf = Key()
    heads = Key()
    latency = Key()
    only = Key()
    open = Key()
    paste = Key()
    policy = Key()
    run = Key()
    source = Key()
    table = Key()
    targets = Key()
    upload = Key()
    wrong = Key()


COMPARE = CompareKeys("cmp")


class DeployKeys(PageKeys):
    """The Deploy page's keys (dep_*)."""
    ack = Key()
    bucket = Key()
    cal = Key()
    cal_ref = Key()
    cal_upload = Key()
    cb_role = Key()
    compute = Key()
    confirm_name = Key()
    cpu_type = Key()
    destroy = Key()
    destroy_local = Key()
    dps = Key()
    dps_filled = Key()
    form = Key()
    go = Key()
    local = Key()
    model = Key()
    outcome = Key()
    path = Key()
    pick = Key()
    plan_dl = Key()
    planned = Key()
    planned_for = Key()
    pools = Key()
    refresh = Key()
    region = Key()
    role = Key()
    scale_max = Key()


DEPLOY = DeployKeys("dep")


class HistoryKeys(PageKeys):
    """The History page's keys (hist_*)."""
    cmp = Key()
    cmp_for = Key()
    delete = Key()
    dl = Key()
    drift = Key()
    log_box = Key()
    log_cw = Key()
    log_from = Key()
    log_group = Key()
    log_import = Key()
    log_policy = Key()
    log_up = Key()
    open = Key()
    open_next = Key()
    pin = Key()
    replay = Key()
    replay_target = Key()
    results = Key()
    table = Key()


HISTORY = HistoryKeys("hist")


class OrderCheckKeys(PageKeys):
    """The Order check page's keys (oc_*)."""
    dl = Key()
    dl_json = Key()
    negated = Key()
    open = Key()
    pos = Key()
    run = Key()
    shift = Key()
    states = Key()


ORDER_CHECK = OrderCheckKeys("oc")


class PlaygroundKeys(PageKeys):
    """The Playground page's keys (pg_*)."""
    debias = Key()
    group = Key()
    last_state = Key()
    permute = Key()
    policy = Key()
    readout = Key()
    run = Key()
    seed = Key()
    state = Key()
    targets = Key()
    upload = Key()


PLAYGROUND = PlaygroundKeys("pg")


class ReviewKeys(PageKeys):
    """The Review page's keys (rv_*)."""
    append = Key()
    label_check = Key()
    made = Key()
    policy = Key()
    pool = Key()
    pool_candidate = Key()
    pool_file = Key()
    pool_import = Key()
    pool_k = Key()
    pool_log = Key()
    pool_log_import = Key()
    pool_open = Key()
    pool_score = Key()
    pool_scored = Key()
    pool_share = Key()
    set = Key()
    set_next = Key()
    skip = Key()
    undo = Key()
    who = Key()


REVIEW = ReviewKeys("rv")


class RobustnessKeys(PageKeys):
    """The Robustness page's keys (rb_*)."""
    attempts = Key()
    checks = Key()
    dl_attempts = Key()
    dl_flips = Key()
    dl_json = Key()
    families = Key()
    flips = Key()
    guard = Key()
    guard_for = Key()
    head_table = Key()
    open = Key()
    rates = Key()
    run = Key()
    templates = Key()


ROBUSTNESS = RobustnessKeys("rb")


class TargetsKeys(PageKeys):
    """The Targets page's keys (tg_*)."""
    form_n = Key()
    kind = Key()
    saved = Key()


TARGETS = TargetsKeys("tg")


class PoliciesKeys(PageKeys):
    """The Policies page's keys (pol_*): its editor's (app/ui/policy_editor.py) and the page's own."""
    add_tpl = Key()
    delete = Key()
    discard = Key()
    dup = Key()
    keep = Key()
    new = Key()
    next = Key()
    open = Key()
    pending = Key()
    pick = Key()
    reload = Key()
    saved = Key()
    shown = Key()
    tab = Key()
    tpl = Key()
    view = Key()


POLICIES = PoliciesKeys("pol")


class TasksKeys(PageKeys):
    """The background-work panel's keys (tasks_*)."""
    mine = Key()
    seen = Key()


TASKS = TasksKeys("tasks")


class ContextKeys(PageKeys):
    """What pages hand each other's keys (ctx_*)."""
    # only keys per item: CONTEXT(name)


CONTEXT = ContextKeys("ctx")


class TaskKeys(PageKeys):
    """A page's own background task (app/ui/tasks.start / collect): TaskKeys(the page's prefix)."""
    failed = Key()
    open = Key()
    planned = Key()
    task = Key()
