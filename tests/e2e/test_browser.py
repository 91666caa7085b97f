"""Browser test: log in to the Airflow UI, see the Evergreen DAGs, open the Evergreen page from the nav bar.

    PYTHONPATH=. python -m pytest -q -m e2e tests/e2e/test_browser.py

Needs the session fixtures of tests/e2e/conftest.py: `airflow_stack` (a running Airflow api-server with
this project's plugins and DAGs: .api_url, .username, .password, .runs_root) and `finished_run` (the
summary dict of a finished continuous_post_training run, on disk under runs_root). The browser is the
system Chromium (/usr/bin/chromium, or $EVERGREEN_CHROMIUM), never a downloaded one.
Screenshots land in tests/e2e/artifacts/: evergreen_page.png (the whole Evergreen page, full length)
and evergreen_in_airflow.png (the page as the Airflow UI shows it, inside its iframe).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
CHROMIUM = os.environ.get("EVERGREEN_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
EVERGREEN_DAGS = ("continuous_post_training", "drift_monitor", "bootstrap_champion", "rollback")
# What the page prints for each run status (plugins/evergreen_page.STATUS_LABEL, repeated here on purpose:
# the test reads the page as a user would, not through the code under test).
DECISION_TEXT = {"promoted": "PROMOTED", "not_promoted": "not promoted", "skipped": "skipped", "failed": "failed"}
TIMEOUT_MS = 30_000  # a cold api-server on 2 busy cores takes seconds to serve its first UI bundle


@pytest.fixture(scope="module")
def browser():
    from playwright import sync_api

    if not Path(CHROMIUM).exists():  # a failure, not a skip: `make test` installs it (Makefile target chromium)
        pytest.fail(
            f"no Chromium at {CHROMIUM}: install the distribution package (apt-get install chromium) "
            "or set EVERGREEN_CHROMIUM; this test never downloads a browser"
        )
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(TIMEOUT_MS)
    pg = context.new_page()
    try:
        yield pg
    finally:
        context.close()


# ------------------------------------------------------------------------ steps a user takes (reusable)


def login(page, api_url: str, username: str, password: str) -> None:
    """Open the UI, get sent to the simple auth manager's form, sign in, land back in the UI."""
    page.goto(api_url + "/")
    page.wait_for_url(re.compile(r"/auth/login"))
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: "/auth/login" not in url)


def dag_list(page, api_url: str, dag_ids=EVERGREEN_DAGS) -> None:
    """Open the DAG list and wait until every dag id is shown as a link."""
    page.goto(api_url + "/dags")
    for dag_id in dag_ids:
        page.get_by_role("link", name=dag_id, exact=True).first.wait_for(state="visible")


def open_evergreen(page):
    """Click the Evergreen nav entry; returns a FrameLocator on the page inside the UI's iframe."""
    page.locator("a[href$='plugin/evergreen']").first.click()
    page.wait_for_url(re.compile(r"/plugin/evergreen"))
    return page.frame_locator("iframe[title='Evergreen']")


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    return path


# ------------------------------------------------------------------------------------------------ test


def test_evergreen_page_in_airflow_ui(airflow_stack, finished_run, page):
    api = airflow_stack.api_url.rstrip("/")
    run_id, status = finished_run["run_id"], finished_run["status"]
    shot_ui = ARTIFACTS / "evergreen_in_airflow.png"

    login(page, api, airflow_stack.username, airflow_stack.password)
    dag_list(page, api)

    frame = open_evergreen(page)
    iframe = page.locator("iframe[title='Evergreen']")
    assert "/evergreen/" in (iframe.get_attribute("src") or ""), f"the nav entry should frame /evergreen/ ({shot_ui})"
    last = frame.locator("#last-decision")
    last.wait_for(state="visible")
    frame.locator("#success-chart").wait_for(state="visible")
    card = frame.locator(f"article.run[data-run-id='{run_id}']")
    card.wait_for(state="attached")
    screenshot(page, shot_ui.name)

    verdict = last.locator(".verdict").inner_text().strip()
    assert verdict in DECISION_TEXT.values(), f"unexpected decision text {verdict!r}; see {shot_ui}"
    if last.get_attribute("data-run-id") == run_id:
        assert verdict == DECISION_TEXT[status], f"last run {run_id} is {status}, page says {verdict!r}; see {shot_ui}"
    badge = card.locator(".badge").inner_text().strip()
    assert badge == DECISION_TEXT[status], f"run {run_id} is {status}, its card says {badge!r}; see {shot_ui}"
    assert frame.locator("#success-chart").evaluate("el => el.tagName.toLowerCase()") == "svg", shot_ui
    assert frame.locator("#cost-chart").count() == 1, f"no cost chart; see {shot_ui}"

    # The whole page, full length: the iframe scrolls inside the UI, so open the page itself (same cookie).
    page.goto(api + "/evergreen/")
    page.locator("#last-decision").wait_for(state="visible")
    shot = screenshot(page, "evergreen_page.png")
    assert page.locator("#success-chart").is_visible(), f"success chart not visible; see {shot}"
    assert page.locator(f"article.run[data-run-id='{run_id}'] .badge").inner_text().strip() == DECISION_TEXT[status], (
        f"run {run_id} shows the wrong decision; see {shot}"
    )
    assert shot.stat().st_size > 10_000, f"screenshot {shot} looks empty"
