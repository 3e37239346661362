"""One real-browser walk through the workbench: Debian chromium driven by Playwright.

Screenshots go to $SEMIF_SCREENSHOTS (docs/ when refreshing the documentation's pictures), else tmp.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import expect

from tests.conftest import ROOT, free_port, spread, subset_file

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists() and not os.environ.get("CI"),
                                 reason="Debian chromium not installed (make test installs it)")]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


def start_workbench(db: Path) -> tuple[str, subprocess.Popen]:
    port = free_port()
    with spread() as env:  # the page's engine, Streamlit and chromium work at once
        proc = subprocess.Popen([sys.executable, "-m", "app", "run", "--port", str(port)], cwd=ROOT,
                                env={**env, "SEMIF_DB": str(db)}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if httpx.get(url + "/_stcore/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.3)
    else:
        proc.kill()
        pytest.fail("streamlit did not start: " + (proc.stdout.read() if proc.stdout else ""))
    return url, proc


@pytest.fixture(scope="module")
def workbench(tmp_path_factory):
    db = tmp_path_factory.mktemp("browser") / "wb.db"
    url, proc = start_workbench(db)
    yield url, db
    proc.terminate()
    proc.wait(20)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with spread():
        pw = sync_playwright().start()
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
    yield b
    b.close()
    pw.stop()


@pytest.fixture(scope="module")
def page(browser):
    ctx = browser.new_context(viewport={"width": 1400, "height": 2200}, accept_downloads=True)
    yield ctx.new_page()
    ctx.close()


def settle(page, timeout=120_000):
    page.wait_for_selector("[data-testid=stApp][data-test-connection-state=CONNECTED]", timeout=timeout)
    page.wait_for_selector("[data-testid=stApp][data-test-script-state=notRunning]", timeout=timeout)
    page.wait_for_function("!document.querySelector('[data-testid=stSkeleton]')", timeout=timeout)


def shot_dir(tmp_path) -> Path:
    d = Path(os.environ.get("SEMIF_SCREENSHOTS") or tmp_path)
    d.mkdir(parents=True, exist_ok=True)
    return d


def choose(page, label: str, option: str, *, last_option: bool = False) -> None:
    """Pick `option` in the selectbox labelled `label`. A rerun that lands between opening the list
    and clicking closes it again (seen on a busy machine): reopen it, up to three times."""
    for _ in range(3):
        page.get_by_label(label).first.click()
        opt = page.get_by_role("option", name=option)
        try:
            (opt.last if last_option else opt.first).click(timeout=10_000)
            settle(page)
            return
        except PlaywrightTimeout:
            page.keyboard.press("Escape")
            settle(page)
    raise AssertionError(f"option {option!r} never appeared in {label!r}")


def open_expander(page, title: str, inside_label: str) -> None:
    """Open the expander `title` unless it already is (Streamlit may keep it open across a rerun)."""
    if not page.get_by_label(inside_label).first.is_visible():
        page.locator("[data-testid=stExpander] summary").filter(has_text=title).first.click()
    page.get_by_label(inside_label).first.wait_for()


SECTIONS = {"Playground": "Decide", "Compare": "Decide", "Order check": "Decide", "History": "Decide",
            "Calibrate": "Calibrate & ship", "Review queue": "Calibrate & ship", "Deploy": "Calibrate & ship", "Policies": "Set up", "Targets": "Set up"}


def nav(page, name: str) -> None:
    """The top navigation: open the page's section menu, click the page."""
    page.get_by_role("button", name=SECTIONS[name]).click()
    page.get_by_role("menuitem", name=name, exact=True).click()
    settle(page)


def test_template_to_chart_in_a_real_browser(workbench, page, tmp_path):
    url, db = workbench
    shots = shot_dir(tmp_path)
    page.goto(url)
    settle(page)
    expect(page.get_by_text("Welcome.")).to_be_visible()
    page.get_by_role("button", name="Load the examples and run a first decision").click()
    settle(page)
    page.wait_for_selector("[data-testid=stPlotlyChart] .js-plotly-plot", timeout=120_000)
    expect(page.get_by_role("heading", name="access")).to_be_visible()  # the promised first decision
    page.get_by_label("State (a ticket, a log excerpt, an agent's context)").fill(
        "My card was charged twice for the same invoice, please refund one payment.")
    page.get_by_role("button", name="Run", exact=True).click()
    settle(page)
    expect(page.locator("[data-testid=stPlotlyChart] g.point")).to_have_count(4)  # one bar per option of ticket routing
    page.screenshot(path=str(shots / "playground.png"), full_page=True)
    page.get_by_text("Call it yourself (cURL)").first.click()
    page.locator("code").filter(has_text="/invocations").first.wait_for()  # the snippet shows once opened

    for name, marker in [("Compare", "Compare targets"), ("History", "History"), ("Policies", "Policies"),
                         ("Targets", "Targets")]:
        nav(page, name)
        page.get_by_role("heading", name=marker).first.wait_for()
        if name == "Compare":
            page.get_by_label("One state per line").fill(
                "I was charged twice this month\nThe app crashes when I open reports\nMy parcel never arrived\n"
                "I cannot sign in since the update")
            page.get_by_role("button", name="Run comparison").click()
            settle(page)
            page.wait_for_selector("[data-testid=stPlotlyChart] .js-plotly-plot", timeout=120_000)
            expect(page.get_by_text("Answers per state")).to_be_visible()
        if name == "History":
            page.wait_for_selector("[data-testid=stDataFrame]")
        if name != "Policies":  # docs/policies.png: the unsaved-changes test shows the page at work
            page.screenshot(path=str(shots / f"{name.lower()}.png"), full_page=True)
    for png in ("playground", "compare", "history", "targets"):
        assert (shots / f"{png}.png").stat().st_size > 10_000

    # order check: three states of the refund check, each in both option orders
    nav(page, "Order check")
    choose(page, "Policy", "Refund policy check")
    page.get_by_text("paste (one per line)").click()
    settle(page)
    page.get_by_label("One state per line").fill("Bought 3 days ago, arrived broken\nFinal sale, changed my mind\n"
                                                 "Unopened, bought yesterday")
    page.get_by_role("button", name="Run the order check").click()
    settle(page)
    page.wait_for_selector("[data-testid=stPlotlyChart] .js-plotly-plot", timeout=120_000)
    expect(page.get_by_text("Top option flips")).to_be_visible()
    page.screenshot(path=str(shots / "order-check.png"), full_page=True)

    # deploy: a GPU SemIf plan (packaging is local; no AWS call happens before confirmation)
    nav(page, "Deploy")
    page.get_by_role("radiogroup", name="Compute").get_by_text("GPU instance pool").click()
    settle(page)
    assert page.get_by_role("radio", name="SemIf adapter image").is_checked()
    page.get_by_label("CPU instance type").wait_for(state="hidden")  # only the GPU pool is asked for
    page.get_by_label("S3 bucket for model.tar.gz").fill("my-models")
    page.get_by_label("SageMaker execution role ARN").fill("arn:aws:iam::123456789012:role/sm")
    page.get_by_label("CodeBuild service role ARN (SemIf path)").fill("arn:aws:iam::123456789012:role/cb")
    page.get_by_role("button", name="Plan", exact=True).click()  # not "Plan a local run"
    settle(page, timeout=300_000)
    page.get_by_text("depending on which pool wins").wait_for(timeout=300_000)  # packaged, then planned
    page.screenshot(path=str(shots / "deploy.png"), full_page=True)

    # calibrate: a small labeled set, evaluated, saved for deployment and downloaded
    nav(page, "Calibrate")
    page.get_by_role("button", name="Import the shipped labeled sets").click()
    settle(page)
    choose(page, "Policy", "Refund policy check")
    open_expander(page, "Labeled sets", "Labels are options of")
    choose(page, "Labels are options of", "Refund policy check")
    page.locator("[data-testid=stFileUploaderDropzoneInput]").first.set_input_files(
        str(subset_file(tmp_path, "refund-check", 30)))
    settle(page)
    page.get_by_role("button", name="Import", exact=True).click()
    settle(page)
    choose(page, "Labeled set", "refund-check.jsonl (38 rows)", last_option=True)
    run = page.get_by_role("button", name=re.compile(r"^Run evaluation \(30 rows"))  # the rows to score, said up front
    run.click()
    # the evaluation runs in the background: the panel shows it, and the page reruns once it is done
    expect(page.get_by_text("Running in the background")).to_be_visible(timeout=60_000)
    expect(page.get_by_text("Running in the background")).to_have_count(0, timeout=300_000)
    settle(page, timeout=300_000)
    page.wait_for_selector("[data-testid=stPlotlyChart] .js-plotly-plot", timeout=120_000)
    page.screenshot(path=str(shots / "calibrate.png"), full_page=True)
    page.get_by_role("button", name="Save for deployment").click()
    settle(page)
    page.get_by_text("Deploy packages it").wait_for()
    with page.expect_download() as dl:
        page.get_by_role("button", name="Download calibrated policy (JSON)").click()
    saved = tmp_path / "downloaded.policy.json"
    dl.value.save_as(saved)
    from adapter.policy import load_policy

    policy = load_policy(saved)
    assert policy.policy_id == "refund-check" and policy.dataset["rows_scored"] == 30
    assert policy.model.file.startswith("SmolLM2")
    assert policy.threshold == 1.0 and policy.metrics.at_gate.decided == 0  # safe: all to fallback
    assert policy.dataset["content_hash"] and policy.model.sha256 and policy.gate_source == "unreachable"


def test_policies_form_and_json_never_lose_a_save(workbench, page):
    """The walkthrough's data loss, in the browser: a Form save must show in the JSON tab, so that
    pressing Apply JSON afterwards keeps the saved notes."""
    url, db = workbench
    page.goto(url)
    settle(page)
    nav(page, "Policies")
    page.get_by_label("Policy", exact=True).click()
    page.get_by_role("option", name="Ticket routing").click()
    settle(page)
    page.get_by_role("tab", name="JSON").click()
    assert "keep these notes" not in page.get_by_label("Policy as JSON (the same saved policy as the form)").input_value()
    version = int(re.search(r"Saved version (\d+)", page.get_by_text("Saved version").inner_text()).group(1))
    page.get_by_role("tab", name="Form").click()
    page.get_by_label("Notes").fill("keep these notes")
    page.get_by_role("button", name="Save policy").click()
    settle(page)
    page.get_by_text(f"Saved version {version + 1}").wait_for()  # the rerun after the save has finished
    page.get_by_role("tab", name="JSON").click()
    # rebuilt from the save (expect retries while the page settles; it fails if the notes never appear)
    expect(page.get_by_label("Policy as JSON (the same saved policy as the form)")).to_have_value(
        re.compile("keep these notes"), timeout=30_000)
    page.get_by_role("button", name="Apply JSON").click()
    settle(page)
    from app.core.store import Store

    assert Store(db).get_policy("ticket-routing")["notes"] == "keep these notes"


@pytest.fixture(scope="module")
def two_policies(tmp_path_factory):
    """A workbench of its own with ticket routing and the refund check saved (the walkthrough's
    workbench starts empty and seeds itself)."""
    from adapter.engine.templates import load_template
    from app.core.store import Store

    db = tmp_path_factory.mktemp("policies") / "wb.db"
    for name in ("ticket-routing", "refund-check"):
        Store(db).save_policy(load_template(name))
    url, proc = start_workbench(db)
    yield url, db
    proc.terminate()
    proc.wait(20)


def saved_policy(db: Path, policy_id: str) -> tuple[str, int]:
    """(question, version) as the SQLite file holds them."""
    import sqlite3

    con = sqlite3.connect(db)
    try:
        question, version = con.execute("SELECT question, version FROM policies WHERE id = ?",
                                        (policy_id,)).fetchone()
    finally:
        con.close()
    return question, version


def open_policy(page, url: str, name: str) -> None:
    """A fresh page on the Policies editor, showing the policy called `name`."""
    page.goto(url)
    settle(page)
    nav(page, "Policies")
    choose(page, "Policy", name)


def test_switching_policy_keeps_unsaved_edits_until_discarded(two_policies, page, tmp_path):
    """The walkthrough's lost edit: a question typed into one policy, then another policy picked. The
    draft stays and the page asks; Keep editing keeps it; a visit to another page keeps it too; Discard
    opens the other policy; nothing is saved in between. The visible New policy button opens an empty one."""
    url, db = two_policies
    before = saved_policy(db, "ticket-routing")
    open_policy(page, url, "Ticket routing")
    question = page.get_by_label("Question", exact=True)
    expect(question).to_have_value(before[0])
    expect(page.get_by_text("Unsaved changes")).to_have_count(0)
    question.fill("Draft: which team should pick up this ticket?")
    choose(page, "Policy", "Refund policy check")  # leaving the field commits the draft, then the pick
    discard = page.get_by_role("button", name="Discard changes and open Refund policy check")
    expect(discard).to_be_visible()
    expect(question).to_have_value("Draft: which team should pick up this ticket?")
    picked = page.get_by_role("combobox", name="Policy", exact=True)
    expect(picked).to_have_value("Ticket routing")  # the selection stays on the policy with the draft
    expect(page.locator("[data-testid=stAlert]").filter(has_text="Unsaved changes").first).to_contain_text("question")
    page.screenshot(path=str(shot_dir(tmp_path) / "policies.png"), full_page=True)
    page.get_by_role("button", name="Keep editing").click()
    settle(page)
    expect(discard).to_have_count(0)
    expect(question).to_have_value("Draft: which team should pick up this ticket?")
    expect(page.get_by_text("Unsaved changes").first).to_be_visible()  # the mark next to the editor stays
    assert saved_policy(db, "ticket-routing") == before
    nav(page, "Calibrate")  # another page: the draft waits on Policies, and this page says so
    expect(page.get_by_text("Unsaved changes to Ticket routing wait on the Policies page")).to_be_visible()
    nav(page, "Policies")
    expect(question).to_have_value("Draft: which team should pick up this ticket?")
    expect(page.get_by_text("Unsaved changes").first).to_be_visible()

    choose(page, "Policy", "Refund policy check")
    discard.click()
    settle(page)
    refund = saved_policy(db, "refund-check")[0]
    expect(question).to_have_value(refund)
    expect(page.get_by_text("Unsaved changes")).to_have_count(0)
    assert saved_policy(db, "ticket-routing") == before  # discarded, never saved
    choose(page, "Policy", "Ticket routing")  # no draft left: it switches at once, to the saved version
    expect(question).to_have_value(before[0])

    page.get_by_role("button", name="New policy", exact=True).click()
    settle(page)
    expect(page.get_by_label("Name", exact=True)).to_have_value("")
    expect(picked).to_have_value("+ New policy")


def test_json_tab_stays_open_with_its_error_and_text(two_policies, page):
    """After Apply JSON with an error, the JSON tab is still the one shown - with the error and the text
    as typed (the page used to jump back to the Form tab)."""
    url, db = two_policies
    before = saved_policy(db, "refund-check")
    open_policy(page, url, "Refund policy check")
    page.get_by_role("tab", name="JSON").click()
    settle(page)
    box = page.get_by_label("Policy as JSON (the same saved policy as the form)")
    box.fill('{"name": "Refund policy check", "question": "Refund?", "options": [')
    page.get_by_role("button", name="Apply JSON").click()
    settle(page)
    expect(page.locator("[data-testid=stAlert]").filter(has_text="not valid JSON").first).to_be_visible()
    expect(page.get_by_role("tab", name="JSON")).to_have_attribute("aria-selected", "true")
    expect(box).to_be_visible()
    expect(box).to_have_value('{"name": "Refund policy check", "question": "Refund?", "options": [')
    assert saved_policy(db, "refund-check") == before


def test_narrow_window_keeps_the_answer_readable(workbench, browser, tmp_path):
    """At 800 px: no sidebar eating a third of the width, and each target's top option fully shown."""
    url, db = workbench
    ctx = browser.new_context(viewport={"width": 800, "height": 1600})
    page = ctx.new_page()
    try:
        page.goto(url)
        settle(page)
        assert not page.locator("[data-testid=stSidebar]").is_visible()
        welcome = page.get_by_role("button", name="Load the examples and run a first decision")
        if welcome.count():
            welcome.click()
            settle(page, timeout=300_000)
        page.get_by_label("State (a ticket, a log excerpt, an agent's context)").fill("My parcel never arrived")
        page.locator("[data-testid=stMultiSelect] input").first.click()
        page.keyboard.type("coder-0.5b")
        page.keyboard.press("Enter")
        page.keyboard.press("Escape")
        settle(page)
        page.get_by_role("button", name="Run", exact=True).click()
        settle(page, timeout=300_000)
        page.wait_for_selector("[data-testid=stPlotlyChart] .js-plotly-plot", timeout=120_000)
        headings = page.locator("[data-testid=stHeadingWithActionElements] h3")
        expect(headings).to_have_count(2)
        for i in range(2):  # the whole word is on screen, nothing cut off with an ellipsis
            assert headings.nth(i).evaluate("e => e.scrollWidth <= e.clientWidth + 1")
            assert headings.nth(i).inner_text().strip() in {"access", "billing", "technical", "shipping"}
        main = page.locator("[data-testid=stMain]").bounding_box()
        assert main["width"] > 760
        page.screenshot(path=str(shot_dir(tmp_path) / "playground-800px.png"), full_page=True)
    finally:
        ctx.close()


def test_two_sessions_editing_one_policy_never_lose_a_save(tmp_path, browser):
    """Two browser sessions edit one policy. B saves after A: B is told "Not saved" with the reason and
    keeps its draft on screen (it used to see "Saved version 2" with A's text, its edit gone); a save
    from B's view of a policy A deleted is refused too, and does not re-create it."""
    from adapter.engine.templates import load_template
    from app.core.store import Store

    db = tmp_path / "wb.db"
    Store(db).save_policy(load_template("ticket-routing"))  # a workbench of its own: other tests expect an empty one
    url, proc = start_workbench(db)
    contexts = [browser.new_context(viewport={"width": 1400, "height": 2200}) for _ in range(2)]
    try:
        a, b = (ctx.new_page() for ctx in contexts)
        for page in (a, b):
            page.goto(url)
            settle(page)
            nav(page, "Policies")
            page.get_by_text("Saved version 1").wait_for()
        a.get_by_label("Notes").fill("from A")
        a.get_by_role("button", name="Save policy").click()
        settle(a)
        a.get_by_text("Saved version 2").wait_for()

        b.get_by_label("Notes").fill("from B")
        b.get_by_role("button", name="Save policy").click()
        settle(b)
        expect(b.get_by_text("Not saved", exact=False).first).to_be_visible()
        expect(b.locator("[data-testid=stAlert]").filter(has_text="saved again (version 2)").first).to_be_visible()
        expect(b.get_by_label("Notes")).to_have_value("from B")  # the draft stays on screen
        assert Store(db).get_policy("ticket-routing")["notes"] == "from A"  # A's save stands

        b.get_by_role("button", name="Load version 2").click()  # B chooses to start again from A's version
        settle(b)
        expect(b.get_by_label("Notes")).to_have_value("from A")

        a.get_by_role("button", name="Delete").click()
        a.get_by_role("button", name="Delete policy").click()
        settle(a)
        b.get_by_label("Notes").fill("ghost")
        b.get_by_role("button", name="Save policy").click()
        settle(b)
        expect(b.locator("[data-testid=stAlert]").filter(has_text="was deleted").first).to_be_visible()
        expect(b.get_by_label("Notes")).to_have_value("ghost")
        assert Store(db).get_policy("ticket-routing") is None  # not re-created from the stale view
    finally:
        for ctx in contexts:
            ctx.close()
        proc.terminate()
        proc.wait(20)


def test_two_models_side_by_side_and_the_html_report(workbench, page, tmp_path, engine, qwen05):
    """History: a run compared with another run of the same rows on another model; the numbers on the
    page are the ones computed from the stored results, and the downloaded report holds them too."""
    from app.core import drift
    from app.core.store import Store
    from tests.conftest import two_model_runs

    url, db = workbench
    store = Store(db)
    run_a, run_b = two_model_runs(store, engine, qwen05, 8, tmp_path=tmp_path)
    want = drift.compare(store.results(run_a), store.results(run_b))
    a_top = {r["row_key"]: r["top_option"] for r in store.results(run_a)}
    flips = sum(a_top[r["row_key"]] != r["top_option"] for r in store.results(run_b))
    assert want.flips == flips
    page.goto(url)
    settle(page)
    nav(page, "History")
    choose(page, "Open run", f"#{run_b} · eval")
    choose(page, "Compare with (run A, the baseline; this run is B)", f"#{run_a} · eval")
    metric = page.locator("[data-testid=stMetric]").filter(has_text="Flips")
    expect(metric.locator("[data-testid=stMetricValue]")).to_have_text(str(flips))
    mcnemar = page.locator("[data-testid=stMetric]").filter(has_text="McNemar exact p")
    expect(mcnemar.locator("[data-testid=stMetricValue]")).to_have_text(f"{want.mcnemar_p:.4f}")
    page.locator("[data-testid=stPlotlyChart] .js-plotly-plot").nth(2).wait_for()  # the three drift charts drew
    page.screenshot(path=str(shot_dir(tmp_path) / "drift.png"), full_page=True)
    with page.expect_download() as dl:
        page.get_by_role("button", name="Download the report (HTML, self-contained)").click()
    report = Path(dl.value.path()).read_text()
    assert f"<tr><th>flips</th><td>{flips}</td></tr>" in report and "<script src=" not in report
    assert report.count("Plotly.newPlot") == 3


def test_review_queue_is_worked_from_the_keyboard(workbench, page, tmp_path):
    """Number keys label the row on screen with that option, U takes it back - real key presses."""
    import sqlite3

    from app.core.store import Store
    from tests.test_review import base_set, seed_queue

    url, db = workbench
    store = Store(db)
    policy, set_id = base_set(store, tmp_path)
    seed_queue(store, store.labeled_rows(set_id)[0]["state"])
    page.goto(url)
    settle(page)
    nav(page, "Review queue")
    choose(page, "Policy", "Ticket routing")
    page.get_by_role("heading", name="Review queue").click()  # focus off the inputs: keys go to the shortcuts
    shown = page.locator("[data-testid=stText]").first.inner_text()
    page.keyboard.press("2")
    # the key press starts a rerun a moment later: wait for what it shows, not for "not running" alone
    expect(page.locator("[data-testid=stText]").first).not_to_have_text(shown)  # the next row is up
    settle(page)
    page.screenshot(path=str(shot_dir(tmp_path) / "review.png"), full_page=True)
    con = sqlite3.connect(db)
    latest = lambda: con.execute("SELECT label, who, undone, state FROM review_labels ORDER BY id DESC LIMIT 1").fetchone()
    label, who, undone, state = latest()
    assert label == policy["options"][1]["id"] and who and undone == 0 and state == "t:" + shown
    page.get_by_role("heading", name="Review queue").click()
    page.keyboard.press("u")
    expect(page.locator("[data-testid=stText]").first).to_have_text(shown)
    settle(page)
    assert latest()[2] == 1  # taken back


def test_an_evaluation_outlives_the_page_and_stops_when_asked(browser, tmp_path):
    """Leaving Calibrate while a run is scored used to leave it interrupted at 42/128: now it runs on, every
    page shows it with progress and a Stop, and coming back shows it finished; Stop leaves it stopped."""
    import json as _json
    import sqlite3

    from app.core.labeled import import_file
    from app.core.store import Store
    from app.service.policies import resolve_policy

    db = tmp_path / "wb.db"
    store = Store(db)
    policy = resolve_policy(store, "ticket-routing")
    rows = [_json.loads(line) for line in (ROOT / "data" / "labeled" / "ticket-routing.jsonl").read_text().splitlines()]
    test_rows = [r for r in rows if r.get("split") != "train"]
    for name, part in (("first.jsonl", test_rows[:60]), ("second.jsonl", test_rows[60:120])):
        import_file(store, name, "".join(_json.dumps(r) + "\n" for r in part).encode(), policy)
    url, proc = start_workbench(db)
    ctx = browser.new_context(viewport={"width": 1400, "height": 2000})
    page = ctx.new_page()
    con = sqlite3.connect(db)
    runs = lambda: con.execute("SELECT r.id, r.status, count(x.id) FROM runs r LEFT JOIN results x ON x.run_id = r.id "
                               "WHERE r.kind = 'eval' GROUP BY r.id ORDER BY r.id").fetchall()
    try:
        page.goto(url + "/calibrate?policy=ticket-routing")  # the URL opens the policy
        settle(page)
        choose(page, "Labeled set", "first.jsonl (60 rows)")
        page.get_by_role("button", name=re.compile(r"^Run evaluation \(60 rows")).click()
        expect(page.get_by_text("Running in the background")).to_be_visible(timeout=60_000)
        nav(page, "History")  # leave the page while it is scored
        expect(page.get_by_text("Running in the background")).to_be_visible()  # every page shows it
        expect(page.get_by_text(re.compile(r"/60 rows"))).to_be_visible(timeout=60_000)
        time.sleep(2)
        nav(page, "Calibrate")
        expect(page.get_by_text("Running in the background")).to_have_count(0, timeout=300_000)
        (first,) = runs()
        assert first[1:] == ("done", 60)  # not interrupted by leaving: every row scored
        settle(page)
        choose(page, "Labeled set", "second.jsonl (60 rows)")
        page.get_by_role("button", name=re.compile(r"^Run evaluation \(60 rows")).click()
        expect(page.get_by_text("Running in the background")).to_be_visible(timeout=60_000)
        expect(page.get_by_text(re.compile(r"set #2 .*: [1-9][0-9]*/60 rows"))).to_be_visible(timeout=120_000)
        page.get_by_role("button", name="Stop", exact=True).first.click()
        expect(page.get_by_text("Running in the background")).to_have_count(0, timeout=120_000)
        _, second = runs()
        assert second[1] == "stopped" and 0 < second[2] < 60  # what was scored stays; running again resumes
        settle(page)
        expect(page.get_by_text(re.compile(r"stopped at \d+/60"))).to_be_visible()
        page.screenshot(path=str(tmp_path / "stopped.png"), full_page=True)
    finally:
        con.close()
        ctx.close()
        proc.terminate()
        proc.wait(20)


def test_the_context_survives_page_switches_reloads_and_links(browser, tmp_path):
    """A policy opened from a link stays the policy on the next page and after a reload; states pasted on
    Compare are still there after a visit to History; /history?run=N opens run N (a deep link used to run the page without the app around it)."""
    from app.core.store import Store
    from app.service.policies import seed_templates

    db = tmp_path / "wb.db"
    store = Store(db)
    seed_templates(store)
    policy = store.get_policy("refund-check")
    target = {"name": "local", "kind": "local", "config": {}}
    runs = [store.create_run(kind="playground", policy=policy, target=target, n_rows=0) for _ in range(3)]
    for rid in runs:
        store.finish_run(rid, "done")
    url, proc = start_workbench(db)
    ctx = browser.new_context(viewport={"width": 1400, "height": 1600})
    page = ctx.new_page()
    try:
        page.goto(url + "/order_check?policy=refund-check")
        settle(page)
        nav(page, "Playground")
        question = page.get_by_text(re.compile(r"^Does this refund request meet the policy"))
        expect(question).to_be_visible()  # the Playground opens the policy of the link
        assert "policy=refund-check" in page.url  # the URL carries it on the new page
        page.reload()
        settle(page)
        expect(question).to_be_visible()  # and a reload keeps it
        nav(page, "Compare")  # what was typed survives a visit to another page (the browser sends no values back)
        pasted = page.get_by_label("One state per line")
        pasted.fill("first state\nsecond state")
        pasted.blur()
        settle(page)
        nav(page, "History")
        nav(page, "Compare")
        expect(page.get_by_label("One state per line")).to_have_value("first state\nsecond state")
        page.goto(url + f"/history?run={runs[0]}")
        settle(page)
        expect(page.get_by_role("combobox", name="Open run")).to_have_value(
            re.compile(rf"^#{runs[0]} · playground"))  # the linked run, not the newest
        assert f"run={runs[0]}" in page.url
    finally:
        ctx.close()
        proc.terminate()
        proc.wait(20)


def test_no_request_leaves_the_machine_from_any_page(workbench, browser):
    """The workbench works offline (issue 35): every page, opened in chromium, asks only the workbench
    itself - no icon, font or script from a public host (a ':material/...' page icon was fetched from
    fonts.gstatic.com)."""
    url, _ = workbench
    ctx = browser.new_context(viewport={"width": 1400, "height": 1200})
    hosts: list[str] = []
    ctx.on("request", lambda req: hosts.append(req.url))
    page = ctx.new_page()
    try:
        for path in ("playground", "compare", "order_check", "robustness", "history", "calibrate", "review",
                     "deploy", "policies", "targets"):
            page.goto(f"{url}/{path}")
            settle(page)
            page.wait_for_timeout(500)  # the favicon and late assets
    finally:
        ctx.close()
    outside = sorted({u for u in hosts if not u.startswith(("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:"))})
    assert hosts and not outside, outside


def test_an_upload_is_mapped_imported_and_selected(browser, tmp_path):
    """Issue 35, finding 9: an upload whose columns are `body` and `team` and whose labels are written
    `bug-frontend`: the page proposes body as the state, team as the label and each label as its option,
    the import succeeds, and the new set is the one selected for evaluation."""
    from app.core.store import Store

    db = tmp_path / "wb.db"
    Store(db).save_policy({"id": "team-routing", "name": "GitHub teams", "question": "Which team should handle "
                           "this GitHub issue?", "options": [{"id": i, "description": i.replace("_", " ")} for i in
                                                             ("bug_frontend", "bug_backend", "docs")]})
    upload = tmp_path / "gh-issues.csv"
    upload.write_text("body,team\n" + "".join(f"issue number {i},{lab}\n" for i, lab in
                                              enumerate(["bug-frontend", "Bug Backend", "docs"] * 3)))
    url, proc = start_workbench(db)
    ctx = browser.new_context(viewport={"width": 1400, "height": 2200})
    page = ctx.new_page()
    try:
        page.goto(f"{url}/calibrate?policy=team-routing")
        settle(page)
        page.locator("[data-testid=stFileUploaderDropzoneInput]").set_input_files(str(upload))
        settle(page)
        expect(page.get_by_label("State column")).to_have_value("body")
        expect(page.get_by_label("Label column")).to_have_value("team")
        expect(page.get_by_role("combobox", name=re.compile(r"Label 'bug\\*-frontend' is the option"))
               ).to_have_value("bug_frontend")
        page.get_by_role("button", name="Import", exact=True).click()
        settle(page)
        expect(page.get_by_text("Imported as set #1: 9 rows to score - selected below.")).to_be_visible()
        expect(page.get_by_label("Labeled set", exact=True)).to_have_value("#1 gh-issues.csv (9 rows)")
    finally:
        ctx.close()
        proc.terminate()
        proc.wait(20)
