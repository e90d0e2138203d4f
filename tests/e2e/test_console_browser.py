"""The operator console in a real browser: Debian's chromium driven by Playwright (no browser download).

Signs in to the admin of a real daphne, checks the admin stylesheet actually applied (static
files served), finds a task by id, cancels it with the admin action, sees the audit event and
opens the dashboard (charts drawn from the vendored library, offline); and opens the landing page,
a running task's own page (its progress changes without a reload) and cancels the task from
there. And checks the dashboard's refusal counts against ``/metrics`` after a scripted burst
(issue 30), and that the page refreshes them itself. Screenshots go to the test's output folder.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.client import McpClient
from tests.support.requirements import skip_or_fail
from tests.support.servers import Proc, Stack

CHROMIUM = os.environ.get("MCPTASKS_CHROMIUM", "/usr/bin/chromium")
#: The dashboard's refusal series (its cells' ``data-kinds``) -> the ``/metrics`` kind they count.
REFUSAL_KINDS = ("task.lookup_failed", "auth.failed", "quota.refused")


@pytest.fixture(scope="module")
def server(stack: Stack) -> Iterator[Proc]:
    """One daphne (plus a worker with PostgreSQL + Redis) whose dashboard refreshes every second.

    Refusal audit windows of an hour: the suppressed counts of a burst are still the throttle's
    (in Redis, not yet ``audit.suppressed`` events) when the dashboard reads them, whatever the
    moment the test runs (tests/security/test_audit_floods.py covers the written events).
    """
    env = {"MCPTASKS_DASHBOARD_REFRESH_S": "1", "MCPTASKS_AUDIT_REFUSAL_EVERY_S": "3600"}
    procs = [stack.daphne(extra_env=env)]
    if stack.multi_process:
        procs.append(stack.worker(concurrency=8, extra_env=env))
    yield procs[0]
    for p in procs:
        p.terminate(timeout=10)


def _browser():  # type: ignore[no-untyped-def]
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        skip_or_fail("needs the playwright package (pip install -e '.[dev]')")
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        skip_or_fail(f"needs Debian's chromium at {CHROMIUM} (apt-get install chromium; .ci/run does)")
    return sync_playwright


def test_operator_signs_in_finds_cancels_and_audits_a_task(stack: Stack, server: Proc, tmp_path: Path) -> None:
    sync_playwright = _browser()
    token = stack.token("console", "console-bot")
    with McpClient(server.url, token=token) as mcp:
        mcp.initialize()
        task = mcp.call_task("demo_sleep", {"ms": 120_000})
    task_id = task["taskId"]
    stack.manage("createsuperuser", "--noinput", "--username", "ops", "--email", "ops@example.com",
                 extra_env={"DJANGO_SUPERUSER_PASSWORD": "ops-password-123"})
    shots = tmp_path / "screenshots"
    shots.mkdir()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-dev-shm-usage"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{server.base}/admin/login/?next=/admin/")
        page.fill("#id_username", "ops")
        page.fill("#id_password", "ops-password-123")
        page.click("input[type=submit]")
        page.wait_for_selector("#site-name")
        # Styled: the admin's stylesheet loaded and applied (the header has its colours and font).
        loaded = page.evaluate("[...document.styleSheets].filter(s => s.href && s.href.includes('/static/admin/css/'))"
                               ".map(s => s.cssRules.length)")
        assert loaded and all(n > 0 for n in loaded), loaded
        header_bg = page.evaluate("getComputedStyle(document.querySelector('#header')).backgroundColor")
        assert header_bg not in ("rgba(0, 0, 0, 0)", "transparent"), header_bg
        page.screenshot(path=str(shots / "01-admin-index.png"), full_page=True)

        page.goto(f"{server.base}/admin/mcptasks/task/?q={task_id}")
        row = page.locator("#result_list tbody tr")
        assert row.count() == 1 and task_id in row.first.inner_text()
        page.screenshot(path=str(shots / "02-task-found.png"), full_page=True)
        row.first.locator("input.action-select").check()
        page.select_option("select[name=action]", "cancel_tasks")
        page.click("button[name=index]")
        page.wait_for_selector(".messagelist")
        assert "Cancelled 1 task" in page.inner_text(".messagelist")
        assert "cancelled" in page.inner_text("#result_list")
        page.screenshot(path=str(shots / "03-task-cancelled.png"), full_page=True)

        page.goto(f"{server.base}/admin/mcptasks/auditevent/?q={task_id}")
        events = page.inner_text("#result_list")
        assert "admin.cancel" in events and "task.cancelled" in events
        page.screenshot(path=str(shots / "04-audit.png"), full_page=True)

        page.goto(f"{server.base}/admin/dashboard/?tenant=console")
        page.wait_for_function("document.body.dataset.chartsReady === '1'")
        drawn = page.evaluate("[...document.querySelectorAll('canvas')].map(c => c.width * c.height)")
        assert len(drawn) == 3 and all(n > 0 for n in drawn)
        page.screenshot(path=str(shots / "05-dashboard.png"), full_page=True)
        browser.close()
    assert len(list(shots.glob("*.png"))) == 5
    print(f"screenshots: {shots}")



def test_operator_watches_a_running_task_on_its_page_and_cancels_it_there(stack: Stack, server: Proc,
                                                                           tmp_path: Path) -> None:
    sync_playwright = _browser()
    token = stack.token("console", "console-bot")
    with McpClient(server.url, token=token) as mcp:
        mcp.initialize()
        task = mcp.call_task("demo_progress", {"steps": 60, "interval_ms": 1000})
    task_id = task["taskId"]
    stack.manage("createsuperuser", "--noinput", "--username", "watcher", "--email", "w@example.com",
                 extra_env={"DJANGO_SUPERUSER_PASSWORD": "watcher-password-123"})
    shots = tmp_path / "screenshots"
    shots.mkdir()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-dev-shm-usage"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        landing = page.goto(f"{server.base}/")
        assert landing is not None and landing.status == 200
        assert "MCP Tasks" in page.inner_text("body")
        page.screenshot(path=str(shots / "01-landing.png"), full_page=True)

        page.goto(f"{server.base}/admin/login/?next=/admin/")
        page.fill("#id_username", "watcher")
        page.fill("#id_password", "watcher-password-123")
        page.click("input[type=submit]")
        page.wait_for_selector("#site-name")

        page.goto(f"{server.base}/admin/mcptasks/task/?q={task_id}")
        row = page.locator("#result_list tbody tr")
        assert row.count() == 1
        # The list fits a 1400 px window: no horizontal scrolling.
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        row.first.locator("th a").click()
        page.wait_for_selector("#task-progress")
        assert task_id in page.inner_text("#content-main")
        # The page is never reloaded while it refreshes: a marker set now survives the changes.
        page.evaluate("window.__notReloaded = true")
        page.wait_for_function("document.getElementById('task-progress').textContent.includes(' / 60')",
                               timeout=30_000)
        first = page.inner_text("#task-progress")
        page.wait_for_function(f"document.getElementById('task-progress').textContent !== {first!r}",
                               timeout=30_000)
        assert page.evaluate("window.__notReloaded === true")
        assert page.inner_text("#task-status") == "working"
        assert "step" in page.inner_text("#task-status-message")
        page.screenshot(path=str(shots / "02-task-running.png"), full_page=True)

        page.click("#task-cancel")
        page.wait_for_selector(".messagelist")
        assert "Cancelled 1 task" in page.inner_text(".messagelist")
        assert page.inner_text("#task-status") == "cancelled"
        assert page.locator("#task-cancel").count() == 0
        page.screenshot(path=str(shots / "03-task-cancelled.png"), full_page=True)
        browser.close()
    assert len(list(shots.glob("*.png"))) == 3


def _refusals_in_metrics(server: Proc) -> dict[str, float]:
    """``mcptasks_refusals_total`` per kind of the web process (from loopback: the stack runs in DEBUG)."""
    resp = httpx.get(f"{server.base}/metrics", timeout=10)
    assert resp.status_code == 200, resp.text[:200]
    found = {kind: 0.0 for kind in REFUSAL_KINDS}
    for kind, value in re.findall(r'^mcptasks_refusals_total\{kind="([^"]+)"\} (\S+)$', resp.text, re.M):
        if kind in found:
            found[kind] = float(value)
    return found


def _cells_js() -> str:
    """JS: the refusal totals shown on the dashboard, by audit kind (read from the DOM)."""
    return ("Object.fromEntries([...document.querySelectorAll('#refusal-totals td[data-kinds]')]"
            ".map(td => [td.dataset.kinds, Number(td.textContent.trim())]))")


def test_dashboard_refusal_counts_match_metrics_after_a_burst_and_refresh_themselves(
        stack: Stack, server: Proc, tmp_path: Path) -> None:
    sync_playwright = _browser()
    token = stack.token("dashburst", "burst-bot")
    # One live task at a time for this tenant: the next creations are quota refusals.
    stack.manage("shell", "-c", "from tenants.models import Tenant; "
                 "Tenant.objects.filter(slug='dashburst').update(max_concurrent_tasks=1)")
    stack.manage("createsuperuser", "--noinput", "--username", "dash", "--email", "dash@example.com",
                 extra_env={"DJANGO_SUPERUSER_PASSWORD": "dash-password-123"})
    before = _refusals_in_metrics(server)
    with McpClient(server.url, token=token) as mcp:
        mcp.initialize()
        mcp.call_task("demo_sleep", {"ms": 120_000})
        for n in range(7):
            missing = mcp.request("tasks/get", {"taskId": f"no-such-task-{n}"})
            assert missing.error["code"] != 0
        for _ in range(3):
            refused = mcp.call("demo_sleep", {"ms": 120_000}, task={})
            assert "quota" in str(refused.error).lower() or "limit" in str(refused.error).lower(), refused.error
    with httpx.Client(timeout=10) as http:
        for n in range(5):
            bad = http.post(f"{server.base}/mcp/t/dashburst", json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                            headers={"Authorization": f"Bearer not-a-token-{n}", "Accept": "application/json, "
                                     "text/event-stream", "Content-Type": "application/json"})
            assert bad.status_code == 401, bad.text[:200]
    sent = {k: v - before[k] for k, v in _refusals_in_metrics(server).items()}
    # Several kinds, several of each (beyond what one throttle window writes as audit rows).
    assert sent == {"task.lookup_failed": 7, "auth.failed": 5, "quota.refused": 3}, sent
    shots = tmp_path / "screenshots"
    shots.mkdir()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-dev-shm-usage"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{server.base}/admin/login/?next=/admin/")
        page.fill("#id_username", "dash")
        page.fill("#id_password", "dash-password-123")
        page.click("input[type=submit]")
        page.wait_for_selector("#site-name")

        page.goto(f"{server.base}/admin/dashboard/?tenant=dashburst")
        page.wait_for_function("document.body.dataset.chartsReady === '1'")
        # As rendered (the tenant is new: every refusal of its chain is one of this burst).
        shown = {k: v for k, v in page.evaluate(_cells_js()).items() if k in REFUSAL_KINDS}
        assert shown == sent, (shown, sent)
        page.screenshot(path=str(shots / "01-dashboard-after-burst.png"), full_page=True)

        # One more refusal: the open page shows it without a reload, and still agrees with /metrics.
        page.evaluate("window.__notReloaded = true")
        with McpClient(server.url, token=token) as mcp:
            mcp.initialize()
            mcp.request("tasks/get", {"taskId": "no-such-task-late"})
        after = {k: v - before[k] for k, v in _refusals_in_metrics(server).items()}
        assert after == {**sent, "task.lookup_failed": 8}, after
        page.wait_for_function(f"({_cells_js()})['task.lookup_failed'] === 8", timeout=15_000)
        assert page.evaluate("window.__notReloaded === true")
        assert page.evaluate("Number(document.body.dataset.refreshed) >= 1")
        shown = {k: v for k, v in page.evaluate(_cells_js()).items() if k in REFUSAL_KINDS}
        assert shown == after, (shown, after)
        page.screenshot(path=str(shots / "02-dashboard-refreshed.png"), full_page=True)
        browser.close()
    assert len(list(shots.glob("*.png"))) == 2
