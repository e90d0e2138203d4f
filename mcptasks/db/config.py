"""How the service connects to PostgreSQL: keepalives, timeouts, and what a pooler allows.

One place builds the connection options from the typed settings (``DB_*`` in
:mod:`mcptasks.conf`), for Django's connections (``settings.py``), the async read connection
(:mod:`mcptasks.db.async_sql`) and the pooled backend (:mod:`mcptasks.db.pooled_postgresql`).

Directly against PostgreSQL (``DB_POOLER=none``) the timeouts are startup options
(``-c lock_timeout=...``): no round trip. A transaction pooler such as PgBouncer refuses startup
options ("unsupported startup parameter") and hands every transaction to any server
connection, so there a session-level ``SET`` would leak to other clients: the timeouts are set
with ``set_config(..., true)`` (``SET LOCAL``) at the start of each transaction instead.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured

#: The values ``DB_POOLER`` takes.
POOLERS = ("none", "transaction")

#: TCP keepalive probe interval and count after ``DB_KEEPALIVES_IDLE_S`` of silence.
KEEPALIVE_INTERVAL_S = 10
KEEPALIVE_COUNT = 3


def _check(app: Any) -> None:
    if app.DB_POOLER not in POOLERS:
        raise ImproperlyConfigured(f"MCPTASKS_DB_POOLER must be one of {', '.join(POOLERS)}, not {app.DB_POOLER!r}")
    for name in ("DB_LOCK_TIMEOUT_MS", "DB_STATEMENT_TIMEOUT_MS", "DB_IDLE_IN_TRANSACTION_TIMEOUT_MS"):
        if getattr(app, name) < 0:
            raise ImproperlyConfigured(f"MCPTASKS_{name} must be 0 (none) or more")


def timeouts(app: Any) -> dict[str, int]:
    """The server settings bounding every statement, lock wait and open transaction (ms)."""
    return {
        "lock_timeout": app.DB_LOCK_TIMEOUT_MS,
        "statement_timeout": app.DB_STATEMENT_TIMEOUT_MS,
        "idle_in_transaction_session_timeout": app.DB_IDLE_IN_TRANSACTION_TIMEOUT_MS,
    }


def pg_connection_options(app: Any) -> dict[str, Any]:
    """libpq/psycopg connection options (Django ``OPTIONS``) for ``app`` (an ``AppSettings``)."""
    _check(app)
    options: dict[str, Any] = {}
    if app.DB_KEEPALIVES_IDLE_S > 0:
        # A host that vanishes without FIN/RST is otherwise noticed only after the OS default
        # (about two hours), with its locks held all that time.
        options.update(
            keepalives=1,
            keepalives_idle=app.DB_KEEPALIVES_IDLE_S,
            keepalives_interval=KEEPALIVE_INTERVAL_S,
            keepalives_count=KEEPALIVE_COUNT,
        )
    if app.DB_POOLER == "transaction":
        # Named prepared statements live on one server connection; the pooler may run the
        # next execution on another (PgBouncer before 1.21 does not track them).
        options["prepare_threshold"] = None
    else:
        startup: dict[str, object] = dict(timeouts(app))
        if app.DB_GENERIC_PLANS:
            # PostgreSQL's default (auto) re-plans a prepared statement whenever its custom plans
            # look cheaper than the generic one: the worker's claim was planned on every
            # execution, as much PostgreSQL CPU as running it (issue 27, bench/RESULTS.md).
            startup["plan_cache_mode"] = "force_generic_plan"
        options["options"] = " ".join(f"-c {name}={value}" for name, value in startup.items())
    return options


def transaction_settings_sql(app: Any) -> str:
    """One statement setting the timeouts for the current transaction only (``SET LOCAL``).

    Built from integers of the typed settings alone.
    """
    _check(app)
    calls = ", ".join(f"set_config('{name}', '{int(value)}', true)" for name, value in timeouts(app).items())
    return f"SELECT {calls}"


def newest_first_pages(qs: Any, size: int = 2000) -> Any:
    """The rows of ``qs``, newest (highest primary key) first, ``size`` per query.

    For exports: keyset pages (``pk < last``) instead of ``.iterator()``'s server-side cursor,
    so memory stays bounded in every mode (behind a transaction pooler ``.iterator()`` has to
    fetch the whole result client-side) and each page is one statement, which a pooler may
    send to any server connection.
    """
    qs = qs.order_by("-pk")
    last = None
    while True:
        page = list((qs if last is None else qs.filter(pk__lt=last))[:size])
        yield from page
        if len(page) < size:
            return
        last = page[-1].pk
