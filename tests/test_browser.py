"""One real-browser walk through the workbench: Debian chromium driven by Playwright.

Screenshots go to $SEMIF_SCREENSHOTS (docs/ when refreshing the README's pictures), else tmp.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, free_port, scored_rows

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists() and not os.environ.get("CI"),
                                 reason="Debian chromium not installed (make test installs it)")]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


@pytest.fixture(scope="module")
def workbench(tmp_path_factory):
    port = free_port()
    db = tmp_path_factory.mktemp("browser") / "wb.db"
    proc = subprocess.Popen([sys.executable, "-m", "app", "run", "--port", str(port)], cwd=ROOT,
                            env={**os.environ, "SEMIF_DB": str(db)}, stdout=subprocess.PIPE,
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
    yield url, db
    proc.terminate()
    proc.wait(20)


@pytest.fixture(scope="module")
def page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        ctx = browser.new_context(viewport={"width": 1400, "height": 2200}, accept_downloads=True)
        yield ctx.new_page()
        browser.close()


def settle(page, timeout=120_000):
    page.wait_for_selector("[data-testid=stApp][data-test-connection-state=CONNECTED]", timeout=timeout)
    page.wait_for_selector("[data-testid=stApp][data-test-script-state=notRunning]", timeout=timeout)
    page.wait_for_function("!document.querySelector('[data-testid=stSkeleton]')", timeout=timeout)


def shot_dir(tmp_path) -> Path:
    d = Path(os.environ.get("SEMIF_SCREENSHOTS") or tmp_path)
    d.mkdir(parents=True, exist_ok=True)
    return d


def test_template_to_chart_in_a_real_browser(workbench, page, tmp_path):
    url, db = workbench
    shots = shot_dir(tmp_path)
    page.goto(url)
    settle(page)
    assert page.get_by_text("Welcome.").is_visible()
    page.get_by_role("button", name="Load the example policies").click()
    settle(page)
    page.get_by_label("State (a ticket, a log excerpt, an agent's context)").fill(
        "After I reset my password this morning the site says my account is locked.")
    page.get_by_role("button", name="Run", exact=True).click()
    settle(page)
    page.wait_for_selector("[data-testid=stPlotlyChart] .js-plotly-plot", timeout=120_000)
    bars = page.locator("[data-testid=stPlotlyChart] g.point")
    assert bars.count() == 4  # one bar per option of ticket routing
    assert page.get_by_text("Top option").is_visible()
    assert page.locator("[data-testid=stMetricValue]").first.inner_text() == "access"
    page.screenshot(path=str(shots / "playground.png"), full_page=True)

    for name, marker in [("Compare", "Compare targets"), ("History", "History"), ("Policies", "Policies"),
                         ("Targets", "Targets")]:
        page.get_by_role("link", name=name).click()
        settle(page)
        page.get_by_role("heading", name=marker).first.wait_for()
        if name == "Compare":
            page.get_by_label("One state per line").fill(
                "I was charged twice this month\nThe app crashes when I open reports\nMy parcel never arrived\n"
                "I cannot sign in since the update")
            page.get_by_role("button", name="Run comparison").click()
            settle(page)
            page.wait_for_selector("[data-testid=stPlotlyChart] .js-plotly-plot", timeout=120_000)
            assert page.get_by_text("Answers per state").is_visible()
        if name == "History":
            page.wait_for_selector("[data-testid=stDataFrame]")
        page.screenshot(path=str(shots / f"{name.lower()}.png"), full_page=True)
    for png in ("playground", "compare", "history", "policies", "targets"):
        assert (shots / f"{png}.png").stat().st_size > 10_000

    # deploy: a GPU SemIf plan (pure: no AWS call happens before confirmation)
    page.get_by_role("link", name="Deploy").click()
    settle(page)
    page.get_by_role("radiogroup", name="Compute").get_by_text("GPU instance pool").click()
    assert page.get_by_role("radio", name="SemIf adapter image").is_checked()
    page.get_by_label("S3 bucket for model.tar.gz").fill("my-models")
    page.get_by_label("SageMaker execution role ARN").fill("arn:aws:iam::123456789012:role/sm")
    page.get_by_label("CodeBuild service role ARN (SemIf path)").fill("arn:aws:iam::123456789012:role/cb")
    page.get_by_role("button", name="Plan").click()
    settle(page)
    assert page.get_by_text("depending on which pool wins").is_visible()
    page.screenshot(path=str(shots / "deploy.png"), full_page=True)

    # calibrate: import the shipped sets, evaluate refund check, download the calibrated policy
    page.get_by_role("link", name="Calibrate").click()
    settle(page)
    page.get_by_role("button", name="Import the shipped labeled sets").click()
    settle(page)
    page.get_by_label("Policy").first.click()
    page.get_by_role("option", name="Refund policy check").click()
    settle(page)
    page.get_by_role("button", name="Run evaluation (resumes unfinished runs)").click()
    settle(page, timeout=300_000)
    page.wait_for_selector("[data-testid=stPlotlyChart] .js-plotly-plot", timeout=120_000)
    page.screenshot(path=str(shots / "calibrate.png"), full_page=True)
    with page.expect_download() as dl:
        page.get_by_role("button", name="Download calibrated policy (JSON)").click()
    saved = tmp_path / "downloaded.policy.json"
    dl.value.save_as(saved)
    from adapter.calibrated import load_policy

    policy = load_policy(saved)
    assert policy.policy_id == "refund-check" and policy.dataset["rows_scored"] == scored_rows("refund-check")
    assert policy.model.file.startswith("SmolLM2")
