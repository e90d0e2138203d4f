"""The operator console in a real browser: Debian's chromium driven by Playwright (no browser download).

Signs in to the admin of a real daphne, checks the admin stylesheet actually applied (static
files served), finds a task by id, cancels it with the admin action, sees the audit event and
opens the dashboard (charts drawn from the vendored library, offline). Screenshots go to the
test's output folder.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tests.support.client import McpClient
from tests.support.requirements import skip_or_fail
from tests.support.servers import Proc, Stack

CHROMIUM = os.environ.get("MCPTASKS_CHROMIUM", "/usr/bin/chromium")


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

