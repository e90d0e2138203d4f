"""System checks for the mcptasks settings (``manage.py check``)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register

from mcptasks import conf
from mcptasks.hardening import DEV_SECRET_PREFIX
from tenants import conf as tenant_conf

#: Upper bounds of the per-process pools (connection budgets, docs/operations.md).
MAX_REDIS_POOL = 500
MAX_DB_THREADS = 64


@register(Tags.security, deploy=True)
def check_secret_key(app_configs: Any, **kwargs: Any) -> list[Any]:
    """The development SECRET_KEY signs cursors and sessions: production must set its own.

    A deployment check (``manage.py check --deploy``): web processes and workers refuse to
    start with the development key anyway, so other commands need not repeat the warning.
    """
    if not settings.DEBUG and str(settings.SECRET_KEY).startswith(DEV_SECRET_PREFIX):
        return [
            Warning(
                "SECRET_KEY is the development default while DEBUG is off.",
                hint="Set SECRET_KEY in the environment; task-list cursors are signed with it.",
                id="mcptasks.W001",
            )
        ]
    return []


@register(Tags.security, deploy=True)
def check_audit_key(app_configs: Any, **kwargs: Any) -> list[Any]:
    """The audit chains need a key of their own in production (see mcptasks/audit/trail.py)."""
    if not settings.DEBUG and not str(getattr(settings, "AUDIT_KEY", "") or ""):
        return [
            Warning(
                "MCPTASKS_AUDIT_KEY is not set while DEBUG is off.",
                hint="Set MCPTASKS_AUDIT_KEY to a long random value kept apart from SECRET_KEY and backups; "
                "the audit chains' HMACs are keyed with it.",
                id="mcptasks.W002",
            )
        ]
    return []


@register(Tags.security, deploy=True)
def check_metrics_token(app_configs: Any, **kwargs: Any) -> list[Any]:
    """Outside DEBUG ``/metrics`` answers only with its token (a reverse proxy on the same host
    makes every request look like loopback), so production must set one."""
    if not settings.DEBUG and not conf.get().METRICS_TOKEN:
        return [
            Warning(
                "MCPTASKS_METRICS_TOKEN is not set while DEBUG is off: GET /metrics refuses every request.",
                hint="Set MCPTASKS_METRICS_TOKEN to a long random value and give it to the Prometheus scraper "
                "(Authorization: Bearer <token>).",
                id="mcptasks.W005",
            )
        ]
    return []


@register(Tags.security)
def check_demo_tools(app_configs: Any, **kwargs: Any) -> list[Any]:
    """mcptasks.W006: the demo tools are installed while DEBUG is off.

    Anyone allowed to call tools could make them sleep (holding worker slots), fail and report
    progress: they are for trying the server out (``manage.py serve``), not for production.
    """
    from django.apps import apps

    if not settings.DEBUG and apps.is_installed("mcptasks.demo"):
        return [
            Warning(
                "The demo tools are installed (MCPTASKS_DEMO_TOOLS=1) while DEBUG is off.",
                hint="Unset MCPTASKS_DEMO_TOOLS in production: any caller may run demo_sleep and demo_progress.",
                id="mcptasks.W006",
            )
        ]
    return []


@register()
def check_app_settings(app_configs: Any, **kwargs: Any) -> list[Any]:
    """Consistency of the MCPTASKS_* settings."""
    s = conf.get()
    problems: list[Any] = []
    if not tenant_conf.get().MCP_PATH.startswith("/"):
        problems.append(Error("MCPTASKS_MCP_PATH must start with '/'.", id="mcptasks.E001"))
    for key in conf.unknown_keys():
        problems.append(Warning(f"settings.MCPTASKS has an unknown key {key!r}.",
                                hint="Check its spelling against docs/settings.md.", id="mcptasks.W004"))
    if s.WORKER_HEARTBEAT_S >= s.WORKER_LEASE_S:
        problems.append(
            Error(
                "MCPTASKS_WORKER_HEARTBEAT_S must be shorter than MCPTASKS_WORKER_LEASE_S.",
                hint="Leases would lapse between heartbeats and tasks would be reclaimed while running.",
                id="mcptasks.E002",
            )
        )
    for name in ("MAX_BODY_BYTES", "TASK_LIST_PAGE_SIZE", "TOOLS_PAGE_SIZE",
                 "CLEANUP_BATCH_SIZE", "WORKER_CONCURRENCY", "TASK_MAX_ATTEMPTS"):
        if getattr(s, name) < 1:
            problems.append(Error(f"MCPTASKS_{name} must be at least 1.", id="mcptasks.E003"))
    if s.REDIS_SOCKET_TIMEOUT_S <= 5:
        problems.append(
            Error(
                "MCPTASKS_REDIS_SOCKET_TIMEOUT_S must exceed 5 s, the channel layer's blocking read.",
                hint="With a shorter socket timeout every stream quiet for 5 s fails its receive.",
                id="mcptasks.E004",
            )
        )
    if not 2 <= s.REDIS_LAYER_POOL_SIZE <= MAX_REDIS_POOL:
        problems.append(Error(f"MCPTASKS_REDIS_LAYER_POOL_SIZE must be between 2 and {MAX_REDIS_POOL}.",
                              hint="It is per event loop and per process: see the budget in docs/operations.md.",
                              id="mcptasks.E005"))
    for name, low in (("SYNC_THREADS", 1), ("WRITE_THREADS", 0)):
        if not low <= getattr(s, name) <= MAX_DB_THREADS:
            problems.append(Error(f"MCPTASKS_{name} must be between {low} and {MAX_DB_THREADS}.",
                                  hint="Each thread holds a PostgreSQL connection: see the budget in "
                                  "docs/operations.md.", id="mcptasks.E006"))
    engine = str(settings.DATABASES["default"]["ENGINE"])
    layer = str(settings.CHANNEL_LAYERS["default"]["BACKEND"])
    if "postgresql" in engine and layer.endswith("InMemoryChannelLayer"):
        problems.append(
            Warning(
                "PostgreSQL is configured but the channel layer is in-memory.",
                hint="Set REDIS_URL so notifications, cancellation and wake-ups reach other processes; "
                "without it they fall back to periodic database polling.",
                id="mcptasks.W003",
            )
        )
    return problems


def hot_tables() -> list[str]:
    """The tables every task writes and rewrites: their dead row versions and statistics need autovacuum."""
    from mcptasks.models import AuditEvent, StreamEvent, Task, TaskMessage

    return [str(m._meta.db_table) for m in (Task, AuditEvent, StreamEvent, TaskMessage)]


def autovacuum_problem(using: str = "default") -> str | None:
    """Why PostgreSQL will not vacuum and analyze the task tables by itself (None when it will,
    or when the database is not PostgreSQL or cannot be asked).

    Without autovacuum the task table is never analyzed: a prepared claim keeps the plan made
    while the table was empty (sequential scans), so every claim reads the whole table, and the
    dead row versions every claim and finish leave are never removed (bench/RESULTS.md measured
    the claim's cost growing through a run; with autovacuum's rule applied, PostgreSQL's CPU per
    task fell by a third).
    """
    from django.db import DatabaseError, connections

    conn = connections[using]
    if conn.vendor != "postgresql":
        return None
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT relname FROM pg_class WHERE relname = ANY(%s) AND reloptions @> %s ORDER BY relname",
                        [hot_tables(), ["autovacuum_enabled=false"]])
            off = [str(r[0]) for r in cur.fetchall()]
            cur.execute("SHOW autovacuum")
            row = cur.fetchone()
    except DatabaseError:
        return None
    if off:
        return f"autovacuum is disabled on {', '.join(off)}"
    if row and str(row[0]).lower() == "off":
        return "PostgreSQL runs with autovacuum = off"
    return None


def autovacuum_warning(using: str = "default") -> Warning | None:
    """mcptasks.W007 for database ``using``, or None (see :func:`autovacuum_problem`)."""
    problem = autovacuum_problem(using)
    if problem is None:
        return None
    return Warning(
        f"{problem}: the task tables are never vacuumed nor analyzed.",
        hint="Claims slow down as the task table grows (a plan made on the empty table, dead rows "
        "never removed). Turn autovacuum on (PostgreSQL's default); see docs/operations.md.",
        id="mcptasks.W007",
    )


@register(Tags.database)
def check_autovacuum(app_configs: Any, databases: Any = None, **kwargs: Any) -> list[Any]:
    """mcptasks.W007: PostgreSQL will not vacuum and analyze the task tables (``manage.py check
    --database default``; the worker logs the same warning when it starts)."""
    return [w for w in (autovacuum_warning(alias) for alias in databases or ()) if w is not None]
