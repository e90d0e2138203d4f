"""A task's creation on PostgreSQL as one statement (see :func:`mcptasks.tasks.creation.acreate_task`).

The quota slot (:func:`tenants.quotas.one_statement_slot_sql`), the task row and its
``task.create`` audit event are data-modifying CTEs of one statement, run in autocommit over
:mod:`mcptasks.db.write_conns`: either all three are written or none. A limited tenant's row is
locked only while the server runs the statement, never across a round trip to Python, and a
tenant without limits writes no counter (issue 27: the ORM's transaction was five round trips plus
a health check on a write thread).
"""

from __future__ import annotations

import datetime as dt
import functools
from typing import Any

from django.db import connections, models
from django.db.models import Field

from mcptasks.db import wakeups, write_conns
from mcptasks.models import instances
from mcptasks.models.audit import AuditEvent
from mcptasks.models.sessions import McpSession
from mcptasks.models.tasks import Task
from mcptasks.models.workers import WorkerHeartbeat
from tenants import quotas

#: The audit event's columns written at creation (as :func:`mcptasks.audit.trail.append` writes them).
_AUDIT_FIELDS = ("tenant_id", "principal_id", "chain", "principal_ref", "action", "task_id", "data", "created_at",
                 "prev_hash", "hash")

_statements: dict[bool, tuple[str, list[Field[Any, Any]], list[Field[Any, Any]], Any]] = {}


#: Field classes (exactly these, not subclasses) whose ``get_db_prep_save`` on PostgreSQL returns
#: a value of this Python type unchanged (aware datetimes for ``DateTimeField``), and returns
#: None for None where the field is nullable. Not the integer fields: Django sends their values
#: as typed integers (psycopg's ``Int4``/``Int8``), so that a prepared statement's parameter
#: types do not change with a value's size.
_AS_IS: dict[type[Any], type[Any]] = {
    models.CharField: str, models.TextField: str, models.BooleanField: bool, models.DateTimeField: dt.datetime,
}


def db_value(field: Field[Any, Any], value: Any, conn: Any) -> Any:
    """``field.get_db_prep_save(value, conn)``, without its calls where that returns ``value``
    itself (issue 27: preparing a task's thirty fields was a tenth of a creation's CPU)."""
    kind = _AS_IS.get(type(field))
    if kind is not None:
        if value is None:
            if field.null:
                return None
        elif type(value) is kind and (kind is not dt.datetime or value.tzinfo is not None):
            return value
    return field.get_db_prep_save(value, conn)


def _build(*, counted: bool) -> tuple[str, list[Field[Any, Any]], list[Field[Any, Any]], Any]:
    """The statement for a counted or an uncounted tenant, the task and audit fields whose values
    it binds (in order), and the connection wrapper that adapts those values.

    The counted statement takes the quota slot (locking the tenant's row while it runs). The
    uncounted one takes none and writes no counter; it inserts only while the tenant still has
    no limit and while neither its row nor the principal's is held ``FOR UPDATE`` elsewhere
    (:func:`tenants.quotas.one_statement_uncounted_sql`); its insert does nothing on a unique
    conflict (a retried idempotency key), so nothing a client sends makes it fail and roll back
    the other creations of its shared batch (:func:`insert_task`). Both answer "not created"
    for what they do not decide.

    The wrapper is kept: adapting a value reads only the backend's operations, which every
    wrapper of the alias shares, while ``connections["default"]`` looks one up in an
    ``asgiref.Local`` and made a new one for every request task (2 % of a web process's CPU
    under the e2e load, issue 27).

    A created task also wakes the listening workers (:mod:`mcptasks.db.wakeups`): while a worker
    waits for wake-ups, ``pg_notify`` runs in the statement and PostgreSQL delivers it on commit;
    the statement's last column says whether it did, for the caller's
    :class:`~mcptasks.db.wakeups.WakeLedger`. (The statement is only used without a transaction
    pooler, which is where workers listen.)
    """
    found = _statements.get(counted)
    if found is None:
        conn = connections["default"]
        quote = conn.ops.quote_name
        task_fields = [f for f in Task._meta.concrete_fields if not f.primary_key]
        by_name = {f.attname: f for f in AuditEvent._meta.concrete_fields}
        audit_fields = [by_name[name] for name in _AUDIT_FIELDS]
        # $1 tenant, $2 principal, $3 the default tenant limit, then the task's values, then the
        # event's. Each value is cast to its column's type: an INSERT ... SELECT does not infer
        # parameter types from the target columns.
        n = 3

        def values(fields: list[Field[Any, Any]]) -> str:
            nonlocal n
            out = []
            for field in fields:
                n += 1
                out.append(f"CAST(${n} AS {field.cast_db_type(conn)})")
            return ", ".join(out)

        if counted:
            ctes, may_insert = quotas.one_statement_slot_sql(tenant="$1", principal="$2", fallback="$3")
        else:
            ctes, may_insert = quotas.one_statement_uncounted_sql(tenant="$1", principal="$2", fallback="$3")
        task_cols = ", ".join(quote(str(f.column)) for f in task_fields)
        audit_cols = ", ".join(quote(str(f.column)) for f in audit_fields)
        if not counted:
            # The task's session is live and the caller's ($4 is the first task value).
            at = 4 + [f.attname for f in task_fields].index("session_id")
            may_insert += " AND " + _live_session_sql(f"CAST(${at} AS varchar)", tenant="CAST($1 AS BIGINT)",
                                                      principal="CAST($2 AS BIGINT)")
        # Identifiers come from the models' metadata; every value is a bound parameter.
        sql = (
            f"WITH {ctes}, "  # noqa: S608
            f"created AS (INSERT INTO {quote(Task._meta.db_table)} ({task_cols}) "
            f"SELECT {values(task_fields)} WHERE {may_insert} {'' if counted else 'ON CONFLICT DO NOTHING '}"
            f"RETURNING {quote(str(Task._meta.pk.column))}), "
            f"audited AS (INSERT INTO {quote(AuditEvent._meta.db_table)} ({audit_cols}) "
            f"SELECT {values(audit_fields)} FROM created) "
            "SELECT (SELECT * FROM created)"
        )
        sql += ", " + notify_sql()
        found = _statements[counted] = (sql, task_fields, audit_fields, conn)
    return found


@functools.cache
def notify_sql() -> str:
    """:func:`mcptasks.db.wakeups.notify_sql` on the workers' rows: the last column of a creating statement."""
    field = WorkerHeartbeat._meta.get_field("wants_wakeups")
    return wakeups.notify_sql(connections["default"].ops.quote_name, table=WorkerHeartbeat._meta.db_table,
                              column=str(field.column))


@functools.cache
def check_sql() -> str:
    """The statement that pays a :class:`~mcptasks.db.wakeups.WakeLedger` debt when no creation follows."""
    return f"SELECT {notify_sql()}"


def _live_session_sql(session_id: str, *, tenant: str, principal: str) -> str:
    """The condition that the session ``session_id`` (an SQL expression) is live and owned by
    ``tenant`` and ``principal``, as :func:`mcptasks.tasks.selectors.get_session` decides: an
    uncounted creation checks it as it inserts, so its caller may skip reading the session
    (:func:`mcptasks.tasks.session_memory.remembered_session`)."""
    quote = connections["default"].ops.quote_name
    # Identifiers come from the model's metadata; the arguments are the caller's SQL expressions.
    return (f"EXISTS (SELECT 1 FROM {quote(McpSession._meta.db_table)} s WHERE s.{quote('id')} = {session_id} "  # noqa: S608
            f"AND s.{quote('ended_at')} IS NULL AND s.{quote('tenant_id')} = {tenant} "
            f"AND s.{quote('principal_id')} = {principal})")


_many: dict[int, str] = {}


def _build_many(n: int) -> str:
    """The uncounted statement of :func:`_build` for ``n`` creations at once, taking their
    parameters one creation after another (each as the single statement takes them) and
    answering a row (its 1-based place, its primary key, the wake-up) per creation made.

    A shared batch of creations as one statement, not ``n`` statements in a pipeline: PostgreSQL
    runs one statement and psycopg handles one result (issue 27: psycopg's pipeline handling of
    each creation's result was 12.6 % of a web process's samples under creation load). Each row
    is checked as the single statement checks it (its tenant must still have no limit), and a
    retried idempotency key leaves only its own row out (``ON CONFLICT DO NOTHING``): a creation
    the statement does not make is answered "not created", and its caller's ORM path decides.
    """
    found = _many.get(n)
    if found is None:
        _, task_fields, audit_fields, conn = _build(counted=False)
        quote = conn.ops.quote_name
        task_names = [f"t{i}" for i in range(len(task_fields))]
        audit_names = [f"a{i}" for i in range(len(audit_fields))]
        names = ["tenant_", "principal_", "fallback_", *task_names, *audit_names]
        types = ["BIGINT", "BIGINT", "INTEGER", *(f.cast_db_type(conn) for f in task_fields),
                 *(f.cast_db_type(conn) for f in audit_fields)]
        width = len(names)
        rows = ", ".join(
            f"({r + 1}, " + ", ".join(f"CAST(${r * width + i + 1} AS {t})" for i, t in enumerate(types)) + ")"
            for r in range(n))
        task_id = task_names[[f.attname for f in task_fields].index("task_id")]
        pk, task_id_col = quote(str(Task._meta.pk.column)), quote(str(Task._meta.get_field("task_id").column))
        task_cols = ", ".join(quote(str(f.column)) for f in task_fields)
        audit_cols = ", ".join(quote(str(f.column)) for f in audit_fields)
        # Identifiers come from the models' metadata; every value is a bound parameter.
        ok = quotas.uncounted_rows_sql(rows="live", tenant="tenant_", principal="principal_", fallback="fallback_")
        session = task_names[[f.attname for f in task_fields].index("session_id")]
        found = _many[n] = (
            f"WITH v (ord_, {', '.join(names)}) AS (VALUES {rows}), "  # noqa: S608
            f"live AS (SELECT * FROM v WHERE "
            f"{_live_session_sql(f'v.{session}', tenant='v.tenant_', principal='v.principal_')}), "
            f"ok AS ({ok}), "
            f"created AS (INSERT INTO {quote(Task._meta.db_table)} ({task_cols}) "
            f"SELECT {', '.join(task_names)} FROM ok ORDER BY ord_ ON CONFLICT DO NOTHING "
            f"RETURNING {pk}, {task_id_col}), "
            f"audited AS (INSERT INTO {quote(AuditEvent._meta.db_table)} ({audit_cols}) "
            f"SELECT {', '.join(audit_names)} FROM ok JOIN created c ON c.{task_id_col} = ok.{task_id} "
            "ORDER BY ok.ord_) "
            f"SELECT ok.ord_, c.{pk}, {notify_sql()} "
            f"FROM ok JOIN created c ON c.{task_id_col} = ok.{task_id}"
        )
    return found


#: The group of :func:`mcptasks.db.write_conns.execute_grouped` that creations of every uncounted
#: tenant share (a counted tenant's group is its id).
UNCOUNTED = "uncounted"


async def insert_task(*, task: Task, audit_data: dict[str, Any], fallback_limit: int | None,
                      counted: bool = True) -> bool:
    """Insert ``task`` (unsaved) with its slot and audit event, waking the listening workers on
    commit; whether it was created.

    ``counted``: whether the tenant's limits (as the caller last read them) count its tasks.
    Concurrent creations share a transaction (:func:`mcptasks.db.write_conns.execute_grouped`):
    a counted tenant's only with each other, since its statement locks the tenant's row for the
    slot, so a batch locks one row and a tenant whose row is held (a frozen lock holder, the
    lock timeout) holds up none but itself. Uncounted tenants' all together (issue 27: grouped
    by tenant, 20 tenants made 0.58x the creations of one): their statement takes no slot and
    writes no counter, writes nothing if a limit was set since the caller read the tenant (the
    caller's ORM path then decides) or if the tenant's or principal's row is held ``FOR UPDATE``
    (which its foreign keys would wait for, holding up the whole batch), and a retried
    idempotency key makes it write nothing rather than fail, so one tenant's requests cannot
    roll back another's creations.

    False when the statement made no decision it may make alone: the tenant is unknown, full,
    or has a per-principal limit, or (uncounted) the task's session is not the caller's live one
    (nothing was written; the caller asks the ORM path, which decides and names the limit, after
    reading a session it had not read). On True, ``task`` is the saved row. Raises what
    :func:`mcptasks.db.write_conns.execute` raises.
    """
    sql, task_fields, audit_fields, conn = _build(counted=counted)
    event = instances.build(AuditEvent, {
        "tenant_id": task.tenant_id, "principal_id": task.principal_id, "chain": task.tenant_id or 0,
        "principal_ref": task.principal_id, "action": "task.create", "task_id": task.task_id, "data": audit_data,
        "created_at": task.created_at,
    })
    params: list[Any] = [task.tenant_id, task.principal_id, fallback_limit]
    params += [db_value(f, getattr(task, f.attname), conn) for f in task_fields]
    params += [db_value(f, getattr(event, f.attname), conn) for f in audit_fields]
    if counted:
        row = await write_conns.execute_grouped(sql, params, group=task.tenant_id, wakes=check_sql())
    else:
        row = await write_conns.execute_grouped(sql, params, group=UNCOUNTED, many=_build_many, wakes=check_sql())
    if row is None or row[0] is None:
        return False
    task.pk = row[0]
    task._state.adding = False
    task._state.db = "default"
    return True
