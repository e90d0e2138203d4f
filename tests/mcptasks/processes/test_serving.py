"""``manage.py serve``'s dev token: the same on every start while it is valid, a new one otherwise."""

from __future__ import annotations

import hashlib
import stat
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from oauth2_provider.models import get_access_token_model

from mcptasks.processes.devserver import DevServer

pytestmark = pytest.mark.django_db


@pytest.fixture
def var_dir(settings: Any, tmp_path: Path) -> Path:
    settings.VAR_DIR = str(tmp_path)
    return tmp_path


def _access(token: str) -> Any:
    return get_access_token_model().objects.get(token_checksum=hashlib.sha256(token.encode()).hexdigest())


def test_a_restart_prints_the_same_token_while_it_is_valid(var_dir: Path) -> None:
    first = DevServer(host="127.0.0.1", port=8000).dev_token()
    again = DevServer(host="127.0.0.1", port=8000).dev_token()
    assert again == first
    assert get_access_token_model().objects.count() == 1  # no pile of valid tokens
    stored = var_dir / "dev-token.json"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600


def test_a_token_for_another_url_revoked_or_nearly_expired_is_replaced(var_dir: Path) -> None:
    first = DevServer(host="127.0.0.1", port=8000).dev_token()
    # Another port: the stored token is bound to the old URL, so a new one is minted for this one.
    other = DevServer(host="127.0.0.1", port=8001).dev_token()
    assert other != first
    # Revoked (DOT deletes the row): replaced.
    _access(other).delete()
    after_revoke = DevServer(host="127.0.0.1", port=8001).dev_token()
    assert after_revoke not in (first, other)
    # Less than a day left: replaced rather than printed to expire under the developer.
    row = _access(after_revoke)
    row.expires = timezone.now() + timedelta(hours=2)
    row.save(update_fields=["expires"])
    assert DevServer(host="127.0.0.1", port=8001).dev_token() != after_revoke


def test_a_tampered_token_file_is_ignored(var_dir: Path) -> None:
    (var_dir / "dev-token.json").write_text("{not json")
    token = DevServer(host="127.0.0.1", port=8000).dev_token()
    assert len(token) > 20
    (var_dir / "dev-token.json").write_text('{"url": "http://127.0.0.1:8000/mcp", "token": "forged"}')
    assert DevServer(host="127.0.0.1", port=8000).dev_token() != "forged"
