"""Settings are defined once: every variable read is documented, the generated tables are current."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from mcptasks.conf import AppSettings, DeploymentSettings
from mcptasks.settings_doc import DOC, render
from tenants.conf import TenantSettings
from tenants.infra.typed_settings import variables
from tests.support.servers import REPO

SETTINGS_PY = (REPO / "mcptasks" / "settings.py").read_text()
DEFINED = set(variables(AppSettings)) | set(variables(TenantSettings)) | set(variables(DeploymentSettings))


def test_documented_settings_match_the_defined_ones() -> None:
    documented = set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)` \|", DOC.read_text(), flags=re.MULTILINE))
    assert DEFINED - documented == set(), f"defined but not documented: {sorted(DEFINED - documented)}"
    assert documented - DEFINED == set(), f"documented but never defined: {sorted(documented - DEFINED)}"


def test_generated_tables_are_current() -> None:
    current = DOC.read_text()
    assert render(current) == current, "run: .venv/bin/python -m mcptasks.settings_doc"


def test_settings_py_reads_no_variable_by_hand() -> None:
    # One loop over the definitions reads every variable; settings.py never names one itself.
    assert not re.search(r"\benv\.(str|int|bool|list|float)\(|os\.environ|getenv", SETTINGS_PY)
    assert set(re.findall(r'"([A-Z][A-Z0-9_]+)"', SETTINGS_PY)) & DEFINED == set()


def test_every_deployment_setting_is_used_by_settings_py() -> None:
    unused = [f.name for f in fields(DeploymentSettings) if f"_deploy.{f.name}" not in SETTINGS_PY]
    assert unused == []


PROBE = """
import json
import django
from django.conf import settings
django.setup()
db = settings.DATABASES["default"]
print(json.dumps({
    "debug": settings.DEBUG, "hosts": settings.ALLOWED_HOSTS, "secret": settings.SECRET_KEY,
    "secrets_key": settings.SECRETS_KEY, "db_name": str(db["NAME"]), "test_name": db.get("TEST", {}).get("NAME"),
    "apps": settings.INSTALLED_APPS, "prefix": settings.CHANNEL_PREFIX, "redis": settings.REDIS_URL,
    "level": settings.LOGGING["root"]["level"], "expire": settings.OAUTH2_PROVIDER["ACCESS_TOKEN_EXPIRE_SECONDS"],
    "layer": settings.CHANNEL_LAYERS["default"]["BACKEND"],
}))
"""


def _probe(env: dict[str, str], tmp: Path) -> dict[str, object]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MCPTASKS_") and k not in {
        "DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS", "LOG_LEVEL"}}
    base.update({"DJANGO_SETTINGS_MODULE": "mcptasks.settings", "MCPTASKS_VAR_DIR": str(tmp)}, **env)
    out = subprocess.run([sys.executable, "-c", PROBE], env=base, cwd=REPO, capture_output=True, text=True,
                         timeout=60, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.processes(reason="reads the settings in a fresh interpreter (python -c)")
def test_deployment_variables_reach_django_settings(tmp_path: Path) -> None:
    env_file = tmp_path / "deploy.env"
    env_file.write_text("LOG_LEVEL=WARNING\nMCPTASKS_CHANNEL_PREFIX=fromfile\n")
    got = _probe({
        "MCPTASKS_ENV_FILE": str(env_file), "DEBUG": "1", "ALLOWED_HOSTS": "mcp.example.com, api.example.com",
        "SECRET_KEY": "s" * 50, "MCPTASKS_SECRETS_KEY": "k1,k2", "MCPTASKS_DEMO_TOOLS": "0",
        "MCPTASKS_CONFORMANCE_FIXTURES": "1", "MCPTASKS_EXTRA_APPS": "django.contrib.humanize",
        "MCPTASKS_TEST_SQLITE_FILE": str(tmp_path / "t.sqlite3"), "MCPTASKS_ACCESS_TOKEN_EXPIRE_S": "120",
        "REDIS_URL": "redis://127.0.0.1:6379/9",
    }, tmp_path)
    assert got["debug"] is True
    assert got["hosts"] == ["mcp.example.com", "api.example.com"]
    assert got["secret"] == "s" * 50 and got["secrets_key"] == "k1,k2"
    assert got["db_name"] == str(tmp_path / "mcptasks.sqlite3")
    assert got["test_name"] == str(tmp_path / "t.sqlite3")
    apps = got["apps"]
    assert isinstance(apps, list)
    assert "mcptasks.demo" not in apps and "mcptasks.conformance" in apps and apps[-1] == "django.contrib.humanize"
    assert got["prefix"] == "fromfile" and got["level"] == "WARNING" and got["expire"] == 120
    assert got["layer"] == "mcptasks.streams.layers.RedisChannelLayer"


@pytest.mark.processes(reason="reads the settings in a fresh interpreter (python -c)")
def test_deployment_defaults(tmp_path: Path) -> None:
    got = _probe({}, tmp_path)
    assert got["debug"] is False and got["prefix"] == "mcptasks" and got["level"] == "INFO"
    assert "mcptasks.demo" not in got["apps"]  # type: ignore[operator]  # off unless enabled
    assert got["layer"] == "channels.layers.InMemoryChannelLayer" and got["redis"] == ""
    assert str(got["secret"]).startswith("dev-insecure-")


@pytest.mark.processes(reason="reads the settings in a fresh interpreter (python -c)")
def test_a_malformed_value_names_its_variable(tmp_path: Path) -> None:
    try:
        _probe({"MCPTASKS_CONN_MAX_AGE": "ten"}, tmp_path)
    except subprocess.CalledProcessError as exc:
        assert "MCPTASKS_CONN_MAX_AGE" in exc.stderr
    else:
        raise AssertionError("a malformed integer was accepted")
