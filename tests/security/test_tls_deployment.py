"""Issue 25 item 9: TLS and cookies are configurable, secure by default, and documented.

The production settings documented in docs/operations.md ("Running behind a TLS proxy") are read
from the page itself, so the docs and this test cannot drift: with them ``manage.py check
--deploy`` reports nothing, and an operator signs in through a TLS-terminating proxy (which says
``X-Forwarded-Proto: https``) with CSRF checks on.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from tests.support.servers import REPO

DOCS = REPO / "docs" / "operations.md"


def documented_production_env() -> dict[str, str]:
    """The ``NAME=value`` lines of the documented block, placeholders filled with random values."""
    text = DOCS.read_text()
    block = re.search(r"<!-- production-env:start -->\s*```dotenv\n(.*?)```\s*<!-- production-env:end -->", text, re.S)
    assert block, "docs/operations.md lost its production settings block"
    env = {}
    for line in block.group(1).splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            env[name.strip()] = secrets.token_urlsafe(48) if value.startswith("<") else value.strip()
    return env


def _run(env: dict[str, str], args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), **env,
            # The services of the block are other machines; the checks need none, the sign-in a
            # database of its own.
            "DATABASE_URL": f"sqlite:///{tmp_path / 'prod.sqlite3'}", "MCPTASKS_VAR_DIR": str(tmp_path)}
    full.pop("REDIS_URL", None)
    return subprocess.run([sys.executable, *args], cwd=REPO, env=full, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.processes(reason="runs manage.py and a TLS proxy in processes of their own")
def test_check_deploy_is_clean_with_the_documented_production_settings(tmp_path: Path) -> None:
    env = documented_production_env()
    assert env["DEBUG"] == "0" and env["SECURE_PROXY_SSL_HEADER"] == "X-Forwarded-Proto"
    done = _run(env, ["manage.py", "check", "--deploy", "--fail-level", "WARNING"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout, done.stdout + done.stderr
    assert "WARNING" not in done.stderr


SIGN_IN_THROUGH_PROXY = r'''
import json, os, re
import django
os.environ["DJANGO_SETTINGS_MODULE"] = "mcptasks.settings"
django.setup()
from django.conf import settings
from django.core.management import call_command
from django.contrib.auth import get_user_model
from django.test import Client

call_command("migrate", verbosity=0)
get_user_model().objects.create_superuser("ops", "", "x-long-passphrase-7")
# What the proxy (on this host) adds to the browser's request.
proxy = {"REMOTE_ADDR": "127.0.0.1", "HTTP_HOST": "mcp.example.com", "HTTP_X_FORWARDED_PROTO": "https",
         "HTTP_X_FORWARDED_FOR": "203.0.113.5"}
browser = Client(enforce_csrf_checks=True, **proxy)
page = browser.get("/admin/login/?next=/admin/")
token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode()).group(1)
signed_in = browser.post("/admin/login/?next=/admin/",
                         {"username": "ops", "password": "x-long-passphrase-7", "next": "/admin/",
                          "csrfmiddlewaretoken": token},
                         HTTP_ORIGIN="https://mcp.example.com", HTTP_REFERER="https://mcp.example.com/admin/login/")
home = browser.get("/admin/")
plain = Client(REMOTE_ADDR="127.0.0.1", HTTP_HOST="mcp.example.com")
print(json.dumps({
    "login_page": page.status_code,
    "sign_in": signed_in.status_code,
    "admin_home": home.status_code,
    "session_cookie_secure": bool(signed_in.cookies["sessionid"]["secure"]) if "sessionid" in signed_in.cookies
                             else None,
    "csrf_cookie_secure": bool(page.cookies["csrftoken"]["secure"]),
    "hsts": page.headers.get("Strict-Transport-Security", ""),
    "session_age": settings.SESSION_COOKIE_AGE,
    "plain_http": plain.get("/admin/login/").status_code,
    "plain_healthz": plain.get("/healthz").status_code,
}))
'''


@pytest.mark.processes(reason="runs manage.py and a TLS proxy in processes of their own")
def test_sign_in_through_a_tls_proxy_with_the_documented_settings(tmp_path: Path) -> None:
    done = _run(documented_production_env(), ["-c", SIGN_IN_THROUGH_PROXY], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["login_page"] == 200
    assert result["sign_in"] == 302, result  # not a CSRF 403
    assert result["admin_home"] == 200
    assert result["session_cookie_secure"] is True and result["csrf_cookie_secure"] is True
    assert result["hsts"].startswith("max-age=31536000") and "includeSubDomains" in result["hsts"]
    assert 8 * 3600 <= result["session_age"] <= 12 * 3600
    assert result["plain_http"] == 301  # plain HTTP is redirected to HTTPS...
    assert result["plain_healthz"] == 200  # ...except the internal probes


def test_cookies_and_hsts_are_secure_by_default_outside_debug() -> None:
    # This test process runs with DEBUG off and none of the variables set.
    assert not settings.DEBUG
    assert settings.SESSION_COOKIE_SECURE is True
    assert settings.CSRF_COOKIE_SECURE is True
    assert settings.SECURE_HSTS_SECONDS >= 31_536_000
    assert settings.SESSION_COOKIE_AGE <= 12 * 3600


SHOW_TLS = """
import json, django
from django.conf import settings
django.setup()
print(json.dumps([settings.SESSION_COOKIE_SECURE, settings.CSRF_COOKIE_SECURE, settings.SECURE_HSTS_SECONDS]))
"""


@pytest.mark.processes(reason="runs manage.py and a TLS proxy in processes of their own")
def test_debug_relaxes_only_what_is_not_set(tmp_path: Path) -> None:
    def shown(env: dict[str, str]) -> list[Any]:
        done = _run({"DJANGO_SETTINGS_MODULE": "mcptasks.settings", **env}, ["-c", SHOW_TLS], tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        return list(json.loads(done.stdout.strip().splitlines()[-1]))

    assert shown({"DEBUG": "1"}) == [False, False, 0]
    assert shown({"DEBUG": "1", "SESSION_COOKIE_SECURE": "1", "SECURE_HSTS_SECONDS": "60"}) == [True, False, 60]
    assert shown({"DEBUG": "0"}) == [True, True, 31_536_000]
