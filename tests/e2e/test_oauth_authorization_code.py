"""The authorization-code + PKCE flow of an interactive client, end to end through daphne.

A user signs in at /accounts/login/, approves the client on /o/authorize/, the client swaps
the code (with its PKCE verifier) for a token at /o/token/, and uses it on the MCP endpoint.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from collections.abc import Iterator
from urllib.parse import parse_qs, urlencode, urlparse

import httpx
import pytest

from tests.support.client import McpClient
from tests.support.servers import Proc, Stack

REDIRECT = "http://127.0.0.1:9/callback"


@pytest.fixture(scope="module")
def web(stack: Stack) -> Iterator[Proc]:
    proc = stack.daphne(extra_env={"MCPTASKS_ALLOW_ANONYMOUS": "0"})
    # Production layout on PostgreSQL + Redis: daphne never runs tools, a worker does.
    worker = stack.worker(concurrency=2) if stack.multi_process else None
    yield proc
    proc.terminate(timeout=10)
    if worker is not None:
        worker.terminate(timeout=10)


def hidden_inputs(html: str) -> dict[str, str]:
    fields = {}
    for tag in re.findall(r"<input[^>]*>", html):
        name = re.search(r'name="([^"]+)"', tag)
        value = re.search(r'value="([^"]*)"', tag)
        if name and ('type="hidden"' in tag or "csrfmiddlewaretoken" in tag):
            fields[name.group(1)] = value.group(1).replace("&amp;", "&") if value else ""
    return fields


def test_authorization_code_with_pkce_yields_a_token_bound_to_the_user(stack: Stack, web: Proc) -> None:
    stack.manage("mcptasks_tenant", "create", "pkceco")
    out = stack.manage("mcptasks_tenant", "app", "pkceco", "--name", "desktop", "--grant", "authorization-code",
                       "--redirect-uri", REDIRECT).stdout
    client_id = re.search(r"client_id=(\S+)", out).group(1)  # type: ignore[union-attr]
    stack.manage("shell", "-c",
                 "from django.contrib.auth.models import User; User.objects.create_user('pat', password='s3cret-pw')")
    stack.manage("mcptasks_tenant", "member", "pkceco", "pat")
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    query = urlencode({"response_type": "code", "client_id": client_id, "redirect_uri": REDIRECT,
                       "code_challenge": challenge, "code_challenge_method": "S256",
                       "scope": "mcp:tools mcp:tasks", "state": "st-1"})
    with httpx.Client(base_url=web.base, follow_redirects=False, timeout=20) as browser:
        first = browser.get(f"/o/authorize/?{query}")
        assert first.status_code == 302 and first.headers["location"].startswith("/accounts/login/")
        login_page = browser.get(first.headers["location"])
        assert login_page.status_code == 200
        form = hidden_inputs(login_page.text)
        signed_in = browser.post("/accounts/login/", data={**form, "username": "pat", "password": "s3cret-pw"})
        assert signed_in.status_code == 302, signed_in.text[:500]
        consent = browser.get(signed_in.headers["location"])
        assert consent.status_code == 200 and "desktop" in consent.text
        approved = browser.post(f"/o/authorize/?{query}", data={**hidden_inputs(consent.text), "allow": "Authorize"})
        assert approved.status_code == 302, approved.text[:500]
        location = urlparse(approved.headers["location"])
        params = parse_qs(location.query)
        assert f"{location.scheme}://{location.netloc}{location.path}" == REDIRECT
        assert params["state"] == ["st-1"]
        code = params["code"][0]
        # A wrong verifier is refused: the code is bound to the PKCE challenge.
        bad = browser.post("/o/token/", data={"grant_type": "authorization_code", "code": code,
                                              "redirect_uri": REDIRECT, "client_id": client_id,
                                              "code_verifier": secrets.token_urlsafe(48)})
        assert bad.status_code in (400, 401)
        # Codes are single-use; get a fresh one for the real exchange.
        again = browser.post(f"/o/authorize/?{query}", data={**hidden_inputs(consent.text), "allow": "Authorize"})
        code = parse_qs(urlparse(again.headers["location"]).query)["code"][0]
        token = browser.post("/o/token/", data={"grant_type": "authorization_code", "code": code,
                                                "redirect_uri": REDIRECT, "client_id": client_id,
                                                "code_verifier": verifier, "resource": web.url})
        assert token.status_code == 200, token.text
        access = token.json()["access_token"]
    with McpClient(web.url, token=access) as mcp:
        mcp.initialize()
        task = mcp.call_task("demo_sleep", {"ms": 10})
        result = mcp.request("tasks/result", {"taskId": task["taskId"]})
        assert result.result["content"][0]["text"] == "Slept for 10 ms"
    owner = stack.manage(
        "shell", "-c",
        f"from mcptasks.models import Task; t = Task.objects.get(task_id='{task['taskId']}'); "
        "print(t.tenant.slug, t.principal.kind, t.principal.identifier)",
    ).stdout.strip().splitlines()[-1].split()  # the shell may print a banner line first
    assert owner == ["pkceco", "user", "pat"]
