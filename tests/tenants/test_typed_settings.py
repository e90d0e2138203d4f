"""The typed settings loop: parsing, defaults in one place, caching, reload and unknown keys."""

from __future__ import annotations

from typing import Any

import pytest

from mcptasks import conf as app_conf
from mcptasks.checks import check_app_settings
from mcptasks.conf import AppSettings
from tenants import conf as tenant_conf
from tenants.checks import tenant_settings
from tenants.conf import TenantSettings
from tenants.infra.typed_settings import read_env


def test_only_variables_that_are_set_are_read_and_typed() -> None:
    env = {"MCPTASKS_WORKER_LEASE_S": "12.5", "MCPTASKS_ALLOWED_ORIGINS": "https://a.example, https://b.example",
           "MCPTASKS_EMBEDDED_WORKER": "true", "MCPTASKS_MAX_BODY_BYTES": "1_000", "UNRELATED": "x"}
    values = read_env(AppSettings, env)
    assert values == {"WORKER_LEASE_S": 12.5, "ALLOWED_ORIGINS": ("https://a.example", "https://b.example"),
                      "EMBEDDED_WORKER": True, "MAX_BODY_BYTES": 1000}
    # Another variable name where a definition says so.
    assert read_env(TenantSettings, {"MCPTASKS_TENANT_LIMITS_CACHE_S": "0"}) == {"LIMITS_CACHE_S": 0.0}


@pytest.mark.parametrize(("name", "raw"), [("MCPTASKS_WORKER_CONCURRENCY", "eight"),
                                           ("MCPTASKS_EMBEDDED_WORKER", "maybe"),
                                           ("MCPTASKS_SSE_KEEPALIVE_S", "")])
def test_a_bad_value_names_its_variable(name: str, raw: str) -> None:
    with pytest.raises(ValueError, match=name):
        read_env(AppSettings, {name: raw})


def test_cached_and_rebuilt_when_the_setting_changes(settings: Any) -> None:
    first = app_conf.get()
    assert app_conf.get() is first  # cached: no rebuild per request
    settings.MCPTASKS = {**settings.MCPTASKS, "WORKER_POLL_S": 0.125}
    assert app_conf.get().WORKER_POLL_S == 0.125
    settings.TENANTS = {**settings.TENANTS, "DEFAULT_TENANT": "elsewhere"}
    assert tenant_conf.get().DEFAULT_TENANT == "elsewhere"


def test_unknown_keys_are_reported(settings: Any) -> None:
    settings.MCPTASKS = {**settings.MCPTASKS, "WORKER_LEASE": 5}
    settings.TENANTS = {**settings.TENANTS, "JWKS_CACHE": 5}
    assert [m.id for m in check_app_settings(None) if m.id == "mcptasks.W004"] == ["mcptasks.W004"]
    assert [m.id for m in tenant_settings(None) if m.id == "tenants.W003"] == ["tenants.W003"]
