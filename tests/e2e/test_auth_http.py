"""The MCP endpoint as an OAuth 2.1 resource server, through a real daphne.

Discovery (RFC 9728 / RFC 8414), the 401/403/400 challenges, every kind of bad token, a real
client-credentials round trip against the built-in authorization server, a JWT from an
external issuer whose JWKS is served over HTTP on localhost, and ``manage.py serve``'s token.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.support.client import ACCEPT_BOTH, McpClient
from tests.support.oauth import JwksServer, KeyPair
from tests.support.servers import REPO, Proc, Stack, free_port

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
HEADERS = {"Accept": ACCEPT_BOTH, "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def auth_server(stack: Stack) -> Iterator[Proc]:
    """As tests/conftest.py's, but the JWKS server on loopback is allowed explicitly (tenants.outbound)."""
    procs = [stack.daphne(extra_env={"MCPTASKS_ALLOW_ANONYMOUS": "0",
                                     "MCPTASKS_OUTBOUND_ALLOWED_NETWORKS": "127.0.0.0/8"})]
    if stack.multi_process:
        procs.append(stack.worker(concurrency=4))
    yield procs[0]
    for p in procs:
        p.terminate(timeout=10)


def _post(server: Proc, token: str | None = None, *, url: str | None = None) -> httpx.Response:
    headers = dict(HEADERS)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.post(url or server.url, json=INIT, headers=headers, timeout=30)


def _challenge(resp: httpx.Response) -> dict[str, str]:
    """The auth-params of a ``WWW-Authenticate: Bearer k="v", ...`` header."""
    value = resp.headers["www-authenticate"]
    assert value.startswith("Bearer "), value
    return dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', value))


def _assert_401(
    resp: httpx.Response, server: Proc, *, error: str | None = "invalid_token", path: str = "mcp"
) -> dict[str, str]:
    assert resp.status_code == 401, (resp.status_code, resp.text)
    params = _challenge(resp)
    assert params["resource_metadata"] == f"{server.base}/.well-known/oauth-protected-resource/{path}"
    assert params["scope"] == "mcp:tools mcp:tasks"
    assert params.get("error") == error
    body = resp.json()
    assert body["jsonrpc"] == "2.0" and isinstance(body["error"]["code"], int)
    return params


# --- discovery and the bare challenge -------------------------------------------------------


def test_no_token_gets_401_with_resource_metadata(auth_server: Proc) -> None:
    resp = _post(auth_server)
    params = _assert_401(resp, auth_server, error=None)  # RFC 6750 §3.1: no error code without a token
    assert "error_description" not in params
    # GET and DELETE are protected the same way.
    assert httpx.get(auth_server.url, headers={"Accept": "text/event-stream"}).status_code == 401
    assert httpx.delete(auth_server.url, headers={"Mcp-Session-Id": "x"}).status_code == 401
    # The challenge leads a client to the metadata, and from there to the authorization server.
    prm = httpx.get(params["resource_metadata"]).json()
    assert prm["resource"] == auth_server.url
    asm = httpx.get(f"{prm['authorization_servers'][0]}/.well-known/oauth-authorization-server").json()
    assert asm["token_endpoint"] == f"{auth_server.base}/o/token/"


def test_protected_resource_metadata(auth_server: Proc) -> None:
    for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"):
        resp = httpx.get(auth_server.base + path)
        assert resp.status_code == 200, path
        doc = resp.json()
        assert doc["resource"] == auth_server.url
        assert auth_server.base in doc["authorization_servers"]
        assert doc["bearer_methods_supported"] == ["header"]
        assert {"mcp:tools", "mcp:tasks", "mcp:tasks:tenant"} <= set(doc["scopes_supported"])
    assert httpx.get(auth_server.base + "/.well-known/oauth-protected-resource/elsewhere").status_code == 404


def test_authorization_server_metadata(auth_server: Proc) -> None:
    doc = httpx.get(auth_server.base + "/.well-known/oauth-authorization-server").json()
    assert doc["issuer"] == auth_server.base
    assert doc["token_endpoint"] == f"{auth_server.base}/o/token/"
    assert doc["authorization_endpoint"] == f"{auth_server.base}/o/authorize/"
    assert "S256" in doc["code_challenge_methods_supported"]
    assert {"authorization_code", "client_credentials"} <= set(doc["grant_types_supported"])
    assert doc["response_types_supported"] == ["code"]


# --- built-in authorization server ----------------------------------------------------------


def _app(stack: Stack, tenant: str, name: str) -> tuple[str, str]:
    """``manage.py mcptasks_tenant app``: a client-credentials application; (client_id, secret)."""
    stack.manage("mcptasks_tenant", "create", tenant)
    lines = stack.manage("mcptasks_tenant", "app", tenant, "--name", name).stdout.strip().splitlines()
    values = dict(line.split("=", 1) for line in lines if "=" in line)
    return values["client_id"], values["client_secret"]


def _client_credentials(server: Proc, client_id: str, secret: str, **extra: str) -> httpx.Response:
    data = {
        "grant_type": "client_credentials",
        "client_id": client_id,
        "client_secret": secret,
        "scope": "mcp:tools mcp:tasks",
        **extra,
    }
    return httpx.post(f"{server.base}/o/token/", data=data, timeout=30)


def test_client_credentials_round_trip(stack: Stack, auth_server: Proc) -> None:
    client_id, secret = _app(stack, "roundtrip", "robot")
    resp = _client_credentials(auth_server, client_id, secret, resource=auth_server.url)
    assert resp.status_code == 200, resp.text
    grant = resp.json()
    assert grant["token_type"].lower() == "bearer" and grant["scope"] == "mcp:tools mcp:tasks"
    assert grant["expires_in"] > 0
    # A resource that is not this server is refused by the authorization server (RFC 8707).
    bad = _client_credentials(auth_server, client_id, secret, resource="https://elsewhere.example/mcp")
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_target"
    # A wrong secret gets no token.
    assert _client_credentials(auth_server, client_id, "wrong").status_code == 401

    with McpClient(auth_server.url, token=grant["access_token"]) as c:
        c.initialize()
        task = c.call_task("demo_sleep", {"ms": 20})
        assert task["status"] == "working"
        assert c.request("tasks/result", {"taskId": task["taskId"]}).result["content"][0]["text"] == "Slept for 20 ms"
    out = stack.manage(
        "shell",
        "-c",
        "from mcptasks.models import Task; t = Task.objects.select_related('tenant','principal')"
        f".get(task_id='{task['taskId']}'); print(t.tenant.slug, t.principal.kind, t.principal.identifier)",
    ).stdout.split()
    assert out[-3:] == ["roundtrip", "client", client_id]
    # Only the checksum of the token is stored, never the token itself.
    stored = stack.manage(
        "shell",
        "-c",
        "from oauth2_provider.models import AccessToken as A; a = A.objects.get(token_checksum=__import__('hashlib')"
        f".sha256({grant['access_token']!r}.encode()).hexdigest()); print(a.token == {grant['access_token']!r})",
    ).stdout.split()
    assert stored[-1] == "False"


def test_refused_builtin_tokens(stack: Stack, auth_server: Proc) -> None:
    stack.manage("mcptasks_tenant", "create", "acme")
    other_audience = (
        stack.manage("mcptasks_tenant", "token", "acme", "--resource", "https://elsewhere.example/mcp")
        .stdout.strip()
        .splitlines()[-1]
    )
    params = _assert_401(_post(auth_server, other_audience), auth_server)
    assert params["error_description"] == "Access token was not issued for this resource"

    expired = stack.manage("mcptasks_tenant", "token", "acme", "--expires-s=-60").stdout.strip().splitlines()[-1]
    assert _assert_401(_post(auth_server, expired), auth_server)["error_description"] == "Access token expired"

    assert _assert_401(_post(auth_server, secrets.token_urlsafe(32)), auth_server)["error_description"] == (
        "Invalid or revoked access token"
    )
    resp = httpx.post(auth_server.url, json=INIT, headers={**HEADERS, "Authorization": "Basic dXNlcjpwdw=="})
    _assert_401(resp, auth_server)

    # A token in the query string is refused (400) even when it is valid, and never looked at.
    good = stack.token("acme", "alice")
    resp = httpx.post(f"{auth_server.url}?access_token={good}", json=INIT, headers=HEADERS)
    assert resp.status_code == 400
    assert _challenge(resp)["error"] == "invalid_request"
    resp = httpx.post(
        f"{auth_server.url}?access_token={good}", json=INIT, headers={**HEADERS, "Authorization": f"Bearer {good}"}
    )
    assert resp.status_code == 400
    assert _post(auth_server, good).status_code == 200  # the same token in the header works


def test_revoked_token_is_refused(stack: Stack, auth_server: Proc) -> None:
    client_id, secret = _app(stack, "revoking", "robot")
    token = _client_credentials(auth_server, client_id, secret).json()["access_token"]
    with McpClient(auth_server.url, token=token) as c:
        c.initialize()
        assert c.request("tools/list", {}).status == 200
        revoke = httpx.post(
            f"{auth_server.base}/o/revoke_token/",
            data={"token": token, "client_id": client_id, "client_secret": secret},
        )
        assert revoke.status_code == 200, revoke.text
        reply = c.request("tools/list", {})
        assert reply.status == 401
        assert _challenge_from_headers(reply.headers)["error_description"] == "Invalid or revoked access token"


def _challenge_from_headers(headers: httpx.Headers) -> dict[str, str]:
    return dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', headers["www-authenticate"]))


# --- external issuer with a JWKS over HTTP on localhost -------------------------------------


class _Jwks:
    """A tiny issuer: the shared JWKS server (tests/support/oauth.py) serving one RSA key pair."""

    def __init__(self) -> None:
        self.pair = KeyPair("k1")
        self.key = self.pair.private
        self.server = JwksServer()
        self.server.keys = [self.pair.jwk]
        self.jwks_url = self.server.url
        self.issuer = self.server.url.rsplit("/", 1)[0] + "/"

    @property
    def fetches(self) -> int:
        """How often the JWKS was fetched."""
        return self.server.hits

    def token(self, aud: str, *, key: Any = None, kid: str = "k1", alg: str = "RS256", **claims: Any) -> str:
        now = int(time.time())
        payload = {
            "iss": self.issuer,
            "aud": aud,
            "sub": "user-1",
            "org": "jwtco",
            "scope": "mcp:tools mcp:tasks",
            "iat": now,
            "exp": now + 300,
            "jti": secrets.token_hex(8),
            **claims,
        }
        return jwt.encode(payload, key if key is not None else self.key, algorithm=alg, headers={"kid": kid})

    def close(self) -> None:
        self.server.close()


@pytest.fixture(scope="module")
def issuer(stack: Stack) -> Iterator[_Jwks]:
    """The test issuer, registered for tenant ``jwtco`` (tenant named by the ``org`` claim)."""
    jwks = _Jwks()
    stack.manage(
        "shell",
        "-c",
        "from tenants.models import ExternalIssuer; from tenants.services import get_or_create_tenant; "
        "t = get_or_create_tenant(slug='jwtco'); "
        f"ExternalIssuer.objects.create(tenant=t, name='test', issuer={jwks.issuer!r}, jwks_url={jwks.jwks_url!r}, "
        "tenant_claim='org', algorithms='RS256')",
    )
    yield jwks
    jwks.close()


def test_external_jwt_is_accepted_and_binds_the_task(stack: Stack, auth_server: Proc, issuer: _Jwks) -> None:
    # The tenant's own endpoint is where its identity provider's tokens are used: the 401
    # there leads to the tenant's metadata, which advertises the issuer and names the endpoint.
    tenant_url = auth_server.url + "/t/jwtco"
    params = _assert_401(_post(auth_server, url=tenant_url), auth_server, error=None, path="mcp/t/jwtco")
    prm = httpx.get(params["resource_metadata"]).json()
    assert prm["resource"] == tenant_url
    assert issuer.issuer in prm["authorization_servers"]
    with McpClient(tenant_url, token=issuer.token(tenant_url)) as c:
        c.initialize()
        task = c.call_task("demo_sleep", {"ms": 20})
        assert c.request("tasks/result", {"taskId": task["taskId"]}).result["content"][0]["text"] == "Slept for 20 ms"
    assert issuer.fetches >= 1  # the key really came over HTTP
    out = stack.manage(
        "shell",
        "-c",
        "from mcptasks.models import Task; t = Task.objects.select_related('tenant','principal')"
        f".get(task_id='{task['taskId']}'); print(t.tenant.slug, t.principal.kind, t.principal.identifier)",
    ).stdout.split()
    assert out[-3:] == ["jwtco", "user", "user-1"]
    # Another subject of the same issuer is another principal: the task is not theirs.
    with McpClient(tenant_url, token=issuer.token(tenant_url, sub="user-2")) as other:
        other.initialize()
        err = other.request("tasks/get", {"taskId": task["taskId"]}).error
        assert err == {"code": -32602, "message": "Failed to retrieve task: Task not found"}


def test_refused_jwts(auth_server: Proc, issuer: _Jwks) -> None:
    aud = auth_server.url + "/t/jwtco"
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cases = {
        "other audience": (
            issuer.token("https://elsewhere.example/mcp"),
            "Access token was not issued for this resource",
        ),
        "expired": (issuer.token(aud, exp=int(time.time()) - 600), "Access token expired"),
        "unknown key": (issuer.token(aud, key=stranger, kid="nobody"), "Token signed with an unknown key"),
        "forged with a known kid": (issuer.token(aud, key=stranger), "Invalid access token"),
        "alg none": (
            jwt.encode(
                {"iss": issuer.issuer, "aud": aud, "sub": "x", "exp": int(time.time()) + 60}, None, algorithm="none"
            ),
            "Token algorithm not allowed",
        ),
        "HS256 with the public key as secret": (
            # The classic algorithm confusion: HMAC keyed with the issuer's own public key (PyJWT
            # refuses to produce it, so it is signed by hand).
            _hs256_with(issuer.key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
                {"iss": issuer.issuer, "aud": aud, "sub": "x", "org": "jwtco", "exp": int(time.time()) + 60}),
            "Token algorithm not allowed",
        ),
        "wrong tenant claim": (issuer.token(aud, org="someone-else"), "Access token is not for this tenant"),
        # The audience is per tenant by default: the shared endpoint is another resource.
        "the shared endpoint as audience": (
            issuer.token(auth_server.url), "Access token was not issued for this resource"
        ),
        "unknown issuer": (issuer.token(aud, iss="https://unknown.example/"), "Invalid access token"),
    }
    for name, (token, description) in cases.items():
        params = _assert_401(_post(auth_server, token, url=aud), auth_server, path="mcp/t/jwtco")
        assert params["error_description"] == description, name
    # A good token for the tenant's endpoint is refused at the shared one.
    params = _assert_401(_post(auth_server, issuer.token(aud)), auth_server)
    assert params["error_description"] == "Access token was not issued for this resource"


# --- command-line tokens --------------------------------------------------------------------


def test_mcptasks_tenant_token_prints_a_working_token_last(stack: Stack, auth_server: Proc) -> None:
    stack.manage("mcptasks_tenant", "create", "clico")
    out = stack.manage("mcptasks_tenant", "token", "clico", "--principal", "ci", "--resource", auth_server.url)
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("#") and len(lines) == 2
    with McpClient(auth_server.url, token=lines[-1]) as c:
        c.initialize()
        assert c.call_task("demo_sleep", {"ms": 10})["status"] == "working"


def test_serve_creates_a_demo_tenant_and_prints_a_token(tmp_path: Path) -> None:
    """``manage.py serve`` from scratch: SQLite under a fresh VAR_DIR, no DATABASE_URL."""
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "MCPTASKS_ALLOW_ANONYMOUS", "MCPTASKS_DEMO_TOOLS")
        and not k.startswith("PYTEST")
    }
    env.update({"MCPTASKS_VAR_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1"})
    log = tmp_path / "serve.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=fh,
        )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = proc.stdout.readline().decode()
            if not line:
                break
            lines.append(line.rstrip("\n"))
            if line.startswith("Dev token"):
                break
        assert lines and lines[-1].startswith("Dev token"), (lines, log.read_text())
        token = lines[-1].split()[-1]
        url = next(line.split()[-1] for line in lines if line.startswith("MCP URL:"))
        assert url == f"http://127.0.0.1:{port}/mcp"
        assert (tmp_path / "mcptasks.sqlite3").exists()
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        assert httpx.post(url, json=INIT, headers=HEADERS).status_code == 401  # tokens are required
        with McpClient(url, token=token) as c:
            c.initialize()
            task = c.call_task("demo_sleep", {"ms": 10})
            assert c.request("tasks/result", {"taskId": task["taskId"]}).result["content"][0]["text"] == (
                "Slept for 10 ms"
            )
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        proc.stdout.close()  # type: ignore[union-attr]


def _hs256_with(secret: bytes, claims: dict[str, Any]) -> str:
    """A JWT signed HS256 with ``secret``, built by hand (kid k1, like the issuer's RS256 key)."""
    import base64
    import hashlib
    import hmac

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    signing_input = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "k1"}).encode()) + "." + b64(
        json.dumps(claims).encode()
    )
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return signing_input + "." + b64(signature)


# --- verified tokens are cached per process; edits elsewhere apply within AUTH_CACHE_S -------


def _status_within(client: McpClient, want: int, *, seconds: float, meanwhile: tuple[int, ...] = (200,)) -> float:
    """Poll tools/list until it answers ``want``; returns how long that took (fails past ``seconds``).

    Until then only the ``meanwhile`` statuses are acceptable (the state before the edit).
    """
    start = time.monotonic()
    while True:
        status = client.request("tools/list", {}).status
        if status == want:
            return time.monotonic() - start
        assert status in meanwhile, status
        assert time.monotonic() - start < seconds, f"still {status} after {seconds} s"
        time.sleep(0.05)


def test_revocation_and_tenant_edits_in_another_process_apply_within_a_second(
    stack: Stack, auth_server: Proc
) -> None:
    # The defaults under test: AUTH_CACHE_S = LIMITS_CACHE_S = 1 s. Each edit is made by another
    # process (a management shell) after the daphne has cached the token and the limits.
    slack = 0.5  # polling interval, the shell's exit and a loaded CI machine
    token = stack.token("cachetenant", "robot")
    with McpClient(auth_server.url, token=token) as c:
        c.initialize()
        for _ in range(3):
            assert c.request("tools/list", {}).status == 200
        stack.manage("shell", "-c", (
            "import hashlib; from oauth2_provider.models import get_access_token_model as m; "
            f"m().objects.filter(token_checksum=hashlib.sha256({token!r}.encode()).hexdigest()).delete()"
        ))
        assert _status_within(c, 401, seconds=1.0 + slack) <= 1.0 + slack

    token = stack.token("cachetenant", "robot2")
    with McpClient(auth_server.url, token=token) as c:
        c.initialize()
        assert c.request("tools/list", {}).status == 200
        stack.manage("shell", "-c", (
            "from tenants.models import Tenant; Tenant.objects.filter(slug='cachetenant').update(rate_other_per_min=1)"
        ))
        assert _status_within(c, 429, seconds=1.0 + slack) <= 1.0 + slack
        stack.manage("shell", "-c", (
            "from tenants.models import Tenant; "
            "Tenant.objects.filter(slug='cachetenant').update(rate_other_per_min=None, active=False)"
        ))
        # Until the edit is seen, the previous limit (1/min, already spent) still refuses with 429.
        assert _status_within(c, 401, seconds=1.0 + slack, meanwhile=(200, 429)) <= 1.0 + slack
