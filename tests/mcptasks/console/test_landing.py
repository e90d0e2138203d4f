"""The landing page at ``/``, ``/mcp`` opened in a browser, and the admin branded as the console."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import channel_layers
from channels.testing import HttpCommunicator
from django.contrib.auth import get_user_model
from django.test import Client

from mcptasks.asgi import router

BROWSER_ACCEPT = b"text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"


@pytest.fixture(autouse=True)
def memory_layer(settings: Any) -> Iterator[None]:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends = {}
    yield
    channel_layers.backends = {}


@pytest.mark.django_db
def test_the_landing_page_says_what_this_is_and_links_everything() -> None:
    response = Client().get("/", HTTP_HOST="127.0.0.1:8000")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    page = response.content.decode()
    assert "mcptasks" in page and "MCP Tasks" in page
    # The MCP URL a client should use, derived from the request.
    assert "http://127.0.0.1:8000/mcp" in page
    for href in ('href="/admin/"', 'href="/admin/dashboard/"', 'href="/api/docs/"', 'href="/docs/"'):
        assert href in page, href


@pytest.mark.django_db
def test_the_documentation_is_served_from_the_docs_folder_and_nothing_else() -> None:
    client = Client()
    index = client.get("/docs/")
    assert index.status_code == 200
    assert 'href="/docs/clients.md"' in index.content.decode()
    page = client.get("/docs/clients.md")
    assert page.status_code == 200 and page["Content-Type"].startswith("text/plain")
    assert b"# Connecting clients" in page.content
    # Only the markdown files of docs/: no traversal, no other files.
    for bad in ("/docs/../pyproject.toml", "/docs/%2e%2e/pyproject.toml", "/docs/nope.md", "/docs/settings.py"):
        assert client.get(bad).status_code == 404, bad


@pytest.mark.django_db
def test_the_admin_is_branded_as_the_console_and_view_site_leads_to_the_landing_page() -> None:
    user = get_user_model().objects.create_superuser(username="root", password="pw-long-enough-1", email="")
    client = Client()
    client.force_login(user)
    page = client.get("/admin/").content.decode()
    assert "<title>mcptasks console" in page or "| mcptasks console</title>" in page
    assert "mcptasks console" in page  # site_header
    assert "Tenants, tasks and audit" in page  # index_title
    assert 'href="/">View site' in page
    assert Client().get("/").status_code == 200


def _get_mcp(headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        comm = HttpCommunicator(router, "GET", "/mcp", headers=[(b"host", b"127.0.0.1:8000"), *headers])
        return await comm.get_response(timeout=5)  # type: ignore[no-any-return]

    return async_to_sync(run)()


def _header(response: dict[str, Any], name: bytes) -> str:
    return next((v.decode() for k, v in response["headers"] if k.lower() == name), "")


@pytest.mark.django_db(transaction=True)
def test_a_browser_opening_mcp_gets_a_page_that_explains_it() -> None:
    response = _get_mcp([(b"accept", BROWSER_ACCEPT)])
    assert response["status"] == 200
    assert _header(response, b"content-type").startswith("text/html")
    body = response["body"].decode()
    assert "MCP endpoint" in body and "http://127.0.0.1:8000/mcp" in body
    assert 'href="/"' in body


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "headers",
    [
        [(b"accept", b"text/event-stream")],  # an MCP client's GET stream
        [(b"accept", b"text/event-stream, text/html")],  # lists SSE: a client, whatever else it lists
        [(b"accept", BROWSER_ACCEPT), (b"authorization", b"Bearer not-a-token")],
        [(b"accept", BROWSER_ACCEPT), (b"mcp-session-id", b"s1")],
        [(b"accept", b"application/json;q=1, text/html;q=0.5")],
    ],
)
def test_mcp_clients_gets_are_unaffected(headers: list[tuple[bytes, bytes]], settings: Any) -> None:
    settings.TENANTS = {**settings.TENANTS, "ALLOW_ANONYMOUS": False}
    response = _get_mcp(headers)
    assert not _header(response, b"content-type").startswith("text/html")
    assert response["status"] in (400, 401, 404, 406), response["status"]
    json.loads(response["body"])  # the endpoint's own JSON error
