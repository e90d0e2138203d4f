"""Reads on the request path without a thread hop: async psycopg on PostgreSQL.

Every ORM query from an async consumer goes through ``database_sync_to_async``: a hop to the
one thread-sensitive executor, a connection health check, and the ORM's SQL compilation, which
together cost more than the query. The two reads nearly every request makes (its session and,
for ``tasks/get``/``tasks/result``, its task) are made here instead, on one async connection per
event loop, with SQL built once per model from its fields and rows turned into ordinary model
instances (as ``Model.from_db`` makes them). They read committed data straight from the database, so a client
that wrote through any process reads its write.

Only committed rows are visible here: code that reads inside an ORM transaction of its own must
use the sync selectors (tests that wrap each test in a transaction turn ``ASYNC_READS`` off).
On SQLite, or when ``ASYNC_READS`` is off, or while the async connection is failing, callers
fall back to the ORM (:func:`available` says which). The selectors in :mod:`mcptasks.tasks.selectors`
own the rules (scoping, expiry); this module only fetches rows.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Sequence
from typing import Any, TypeVar

from django.conf import settings
from django.db import connections
from django.db.models import Model
from django.db.models.base import ModelState

from mcptasks import conf
from tenants.infra.coalesce import Coalescer

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=Model)
N = TypeVar("N", bound=Model)

#: After a failure, the ORM serves reads for this long before the async path is tried again.
RETRY_AFTER_S = 2.0

_conns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()
_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()
_failed_until = 0.0
_sql_cache: dict[tuple[type[Model], tuple[str, ...], tuple[str, ...], str], tuple[str, list[str]]] = {}


def available() -> bool:
    """Whether reads may take the async path now (PostgreSQL, enabled, not recently failing)."""
    # The engine is read from settings, not ``connections``: a connection handler lookup from
    # async code costs more than the rest of this check.
    return (
        conf.get().ASYNC_READS
        and settings.DATABASES["default"]["ENGINE"] in POSTGRESQL_ENGINES
        and time.monotonic() >= _failed_until
    )


POSTGRESQL_ENGINES = frozenset(
    {"django.db.backends.postgresql", "django.db.backends.postgresql_psycopg2", "mcptasks.db.pooled_postgresql"}
)


def conninfo() -> dict[str, Any]:
    """psycopg connection parameters of the default database, in autocommit (also for
    :mod:`mcptasks.db.write_conns`)."""
    db = connections["default"].settings_dict
    params: dict[str, Any] = {"dbname": db["NAME"], "autocommit": True}
    for key, name in (("USER", "user"), ("PASSWORD", "password"), ("HOST", "host"), ("PORT", "port")):
        if db.get(key):
            params[name] = db[key]
    for key, value in (db.get("OPTIONS") or {}).items():
        # libpq options (sslmode, sslrootcert, ...); Django's own keys are not for libpq.
        if key not in {"pool", "isolation_level", "server_side_binding", "assume_role", "cursor_factory",
                       "prepare_threshold", "context"}:
            params[key] = value
    # No session state (a transaction pooler would refuse a ``TimeZone`` startup option or leak
    # a SET to other clients): timestamps are read as UTC by the connection's own loader.
    if conf.get().DB_POOLER == "transaction":
        # No automatic prepared statements either: see :func:`_read`.
        params["prepare_threshold"] = None
    return params


def utc_timestamptz_loader() -> type[Any]:
    """A ``timestamptz`` loader giving UTC datetimes whatever the session's ``TimeZone``.

    PostgreSQL's ISO output (``2026-11-29 03:21:11.513+00``) is parsed by
    ``datetime.fromisoformat`` (C); anything else (another ``DateStyle``, ``infinity``, BC
    dates) by psycopg's own loader. Issue 27: psycopg's loader, in Python, was a tenth of a
    ``tasks/get``'s CPU (a task and its session carry a dozen timestamps).
    """
    import datetime as dt

    from psycopg.types.datetime import TimestamptzLoader

    class UtcTimestamptzLoader(TimestamptzLoader):
        def __init__(self, oid: int, context: Any = None) -> None:
            super().__init__(oid, context)
            self._timezone = dt.UTC

        def load(self, data: Any) -> dt.datetime:
            try:
                value = dt.datetime.fromisoformat(bytes(data).decode())
            except ValueError:
                value = None
            if value is None or value.tzinfo is None:
                return super().load(data)
            return value.astimezone(dt.UTC)

    return UtcTimestamptzLoader


async def _connection() -> Any:
    import psycopg

    loop = asyncio.get_running_loop()
    conn = _conns.get(loop)
    if conn is not None and not conn.closed and not conn.broken:
        return conn
    lock = _locks.setdefault(loop, asyncio.Lock())
    async with lock:
        conn = _conns.get(loop)
        if conn is None or conn.closed or conn.broken:
            conn = await psycopg.AsyncConnection.connect(**conninfo(), connect_timeout=5)
            conn.adapters.register_loader("timestamptz", utc_timestamptz_loader())
            _conns[loop] = conn
    return conn


def _select(model: type[M], where: Sequence[str], skip: Sequence[str], tail: str = "LIMIT 1") -> tuple[str, list[str]]:
    key = (model, tuple(where), tuple(skip), tail)
    cached = _sql_cache.get(key)
    if cached is None:
        fields = [f for f in model._meta.concrete_fields if f.name not in skip]
        names = [f.attname for f in fields]
        cols = ", ".join(f'"{f.column}"' for f in fields)
        cond = " AND ".join(where)
        # Identifiers come from the model's own metadata and the callers' fixed conditions and
        # orderings; values are always bound parameters.
        sql = f'SELECT {cols} FROM "{model._meta.db_table}" WHERE {cond} {tail}'  # noqa: S608
        cached = _sql_cache[key] = (sql, names)
    return cached


async def fetch_many(
    model: type[M], *, where: Sequence[str], params: Sequence[Any], order_by: str, limit: int,
    skip: Sequence[str] = (),
) -> list[M]:
    """Up to ``limit`` rows of ``model`` matching ``where``, ordered by ``order_by`` (a fixed SQL
    ordering), as instances; :class:`Unavailable` as for :func:`fetch_one`."""
    sql, names = _select(model, where, skip, tail=f"ORDER BY {order_by} LIMIT %s")
    rows = await _read(sql, [*params, limit], all_rows=True)
    return [_build(model, names, row) for row in rows]


async def fetch_one(
    model: type[M], *, where: Sequence[str], params: Sequence[Any], skip: Sequence[str] = ()
) -> M | None:
    """The first row of ``model`` matching ``where`` (SQL conditions with ``%s``), as an instance.

    ``skip`` names fields not to load (they are deferred: touching one would query, so callers
    skip only what they never read). Raises :class:`Unavailable` when the database cannot be
    reached this way; the caller then uses the ORM.
    """
    sql, names = _select(model, where, skip)
    row = await _read(sql, params, all_rows=False)
    if row is None:
        return None
    return _build(model, names, row)


def mark_failed() -> None:
    """Send reads (and single-statement writes) through the ORM for ``RETRY_AFTER_S``."""
    global _failed_until
    _failed_until = time.monotonic() + RETRY_AFTER_S


async def _read(sql: str, params: Sequence[Any], *, all_rows: bool | None) -> Any:
    """Run ``sql`` on this loop's connection: every row, the first, or none (``all_rows=None``:
    a write); :class:`Unavailable` (and the ORM for ``RETRY_AFTER_S``) if the database cannot
    be reached this way."""
    try:
        conn = await _connection()
        # A raw cursor takes PostgreSQL's own $n placeholders: psycopg does not parse the
        # statement for %s on every call (it caches that only for short statements, and the
        # batched ones are long).
        from psycopg import AsyncRawCursor

        cur = AsyncRawCursor(conn)
        # Prepared once per connection for speed, unless a transaction pooler sits in between:
        # a named statement lives on one server connection, and the pooler may send the next
        # execution to another, where the name is missing or another client's statement.
        prepare = conf.get().DB_POOLER != "transaction"
        await cur.execute(_numbered(sql), list(params), prepare=prepare)
        if all_rows is None:
            return None
        return await (cur.fetchall() if all_rows else cur.fetchone())
    except Exception as exc:
        mark_failed()
        logger.warning("async read failed (%s); using the ORM for %.0f s", type(exc).__name__, RETRY_AFTER_S)
        raise Unavailable from exc


async def fetch_row(sql: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
    """The first row of ``sql`` (``%s`` placeholders) as a tuple, or None; :class:`Unavailable`
    as :func:`fetch_one`. For statements of other modules' making (``tenants``' verdict fingerprint)."""
    row = await _read(sql, params, all_rows=False)
    return None if row is None else tuple(row)


async def fetch_pair(
    first: tuple[type[M], Sequence[str], Sequence[Any]],
    second: tuple[type[N], Sequence[str], Sequence[Any], Sequence[str]],
) -> tuple[M | None, N | None]:
    """:func:`fetch_one` of two unrelated rows in one round trip: ``(model, where, params[, skip])``.

    Either may be missing (None). One statement, so both rows come from the same snapshot.
    Concurrent calls of the same shape on one event loop share a statement (see
    :class:`_Batches`): under load one round trip serves many requests.
    """
    model_a, where_a, params_a = first
    model_b, where_b, params_b, skip_b = second
    sql_a, names_a = _select(model_a, where_a, ())
    sql_b, names_b = _select(model_b, where_b, skip_b)
    # Each side is at most one row; FULL JOIN ON TRUE keeps whichever exists.
    pair_sql = f"SELECT * FROM ({sql_a}) AS a FULL JOIN ({sql_b}) AS b ON TRUE"  # noqa: S608
    row = await _batched(pair_sql, [*params_a, *params_b])
    if row is None:
        return None, None
    a_row, b_row = row[: len(names_a)], row[len(names_a):]
    return _instance(model_a, names_a, a_row), _instance(model_b, names_b, b_row)


async def fetch_one_batched(model: type[M], *, where: Sequence[str], params: Sequence[Any]) -> M | None:
    """:func:`fetch_one`, sharing one statement with the concurrent reads of the same shape on this
    event loop (:class:`_Batches`): for reads every request of a kind makes, such as the session
    of each ``tools/call`` (issue 27: a round trip of its own on the loop's one connection)."""
    sql, names = _select(model, where, ())
    row = await _batched(sql, list(params))
    return None if row is None else _build(model, names, row)


async def _batched(sql: str, params: list[Any]) -> Any:
    """The row of ``sql`` for ``params`` (or None), read in the next batch of its statement."""
    batches = _batches.get(sql)
    if batches is None:
        batches = _batches[sql] = _Batches(sql)
    return await batches.coalescer.call(params)


class _Batches:
    """The reads of one statement (at most one row each), batched: ``n`` reads become one
    ``UNION ALL`` of ``n`` copies of the statement, each tagged with its position (statement
    text cached per ``n``, so each size is prepared once per connection where statements are
    prepared). A read whose copy returns no row gets None."""

    def __init__(self, sql: str) -> None:
        self.one_sql = sql
        self.sized: dict[int, str] = {}
        self.coalescer: Coalescer[list[Any], Any] = Coalescer(self._run, max_batch=MAX_BATCH)

    def sql(self, n: int) -> str:
        sql = self.sized.get(n)
        if sql is None:
            if n == 1:
                sql = self.one_sql
            else:
                # Built from the statement and integers only; values stay bound parameters.
                sql = " UNION ALL ".join(
                    f"SELECT {i} AS n, * FROM ({self.one_sql}) AS p{i}" for i in range(n)  # noqa: S608
                )
            self.sized[n] = sql
        return sql

    async def _run(self, batch: Sequence[list[Any]]) -> list[Any]:
        params = [p for item in batch for p in item]
        if len(batch) == 1:
            return [await _read(self.sql(1), params, all_rows=False)]
        found: list[Any] = [None] * len(batch)
        for row in await _read(self.sql(len(batch)), params, all_rows=True):
            found[row[0]] = row[1:]
        return found


#: The most reads one batched statement carries.
MAX_BATCH = 32
#: The batching of each statement read this way, by its text.
_batches: dict[str, _Batches] = {}


def _instance(model: type[M], names: list[str], values: Sequence[Any]) -> M | None:
    # The primary key is never null in a stored row: null means this side had no row.
    if values[names.index(model._meta.pk.attname)] is None:
        return None
    return _build(model, names, values)


def _build(model: type[M], names: list[str], values: Sequence[Any]) -> M:
    """A model instance loaded from a row, as ``Model.from_db`` makes it, minus its cost.

    ``from_db`` runs ``__init__`` (every field's descriptor, the init signals), which costs
    more than the query on the request path. The instance is the same: field values in its
    ``__dict__`` (fields not loaded stay deferred, read on access like the ORM's ``only()``),
    ``_state`` saying it came from the database. The models read here have no init signals
    (checked by tests/mcptasks/tasks/test_fastreads.py).
    """
    obj = model.__new__(model)
    state = ModelState()
    state.adding, state.db = False, "default"
    obj._state = state
    obj.__dict__.update(zip(names, values, strict=True))
    return obj



def _numbered(sql: str) -> str:
    """``sql`` with its ``%s`` placeholders as ``$1``, ``$2``, ... (cached per statement)."""
    numbered = _numbered_sql.get(sql)
    if numbered is None:
        parts = sql.split("%s")
        numbered = parts[0] + "".join(f"${i}{part}" for i, part in enumerate(parts[1:], start=1))
        _numbered_sql[sql] = numbered
    return numbered


_numbered_sql: dict[str, str] = {}


async def insert(model: type[Model], values: dict[str, Any]) -> None:
    """Insert one row of ``model`` (``values`` by column attname), committed when this returns.

    For append-only rows written on the request path (audit events). Inserts of the same
    columns made at the same time share one statement. :class:`Unavailable` as for reads; as
    with any write whose connection fails, the row may or may not have been committed then.
    """
    columns = tuple(values)
    batches = _insert_batches.get((model, columns))
    if batches is None:
        batches = _insert_batches[(model, columns)] = _InsertBatches(model, columns)
    await batches.coalescer.call([_param(v) for v in values.values()])


def _param(value: Any) -> Any:
    """A value as psycopg binds it: dicts and lists as jsonb (the JSONField columns)."""
    if isinstance(value, dict | list):
        from psycopg.types.json import Jsonb

        return Jsonb(value)
    return value


class _InsertBatches:
    """Inserts of one model and column set: ``n`` rows become one multi-row ``INSERT``."""

    def __init__(self, model: type[Model], columns: tuple[str, ...]) -> None:
        by_attname = {f.attname: f.column for f in model._meta.concrete_fields}
        names = ", ".join(f'"{by_attname[c]}"' for c in columns)
        # Identifiers from the model's metadata; values are bound parameters.
        self.head = f'INSERT INTO "{model._meta.db_table}" ({names}) VALUES '  # noqa: S608
        self.width = len(columns)
        self.coalescer: Coalescer[list[Any], None] = Coalescer(self._run, max_batch=MAX_BATCH)

    async def _run(self, batch: Sequence[list[Any]]) -> list[None]:
        row = "(" + ", ".join(["%s"] * self.width) + ")"
        sql = self.head + ", ".join([row] * len(batch))
        await _read(sql, [p for item in batch for p in item], all_rows=None)
        return [None] * len(batch)


_insert_batches: dict[tuple[type[Model], tuple[str, ...]], _InsertBatches] = {}


class Unavailable(Exception):
    """The async path failed; read through the ORM instead."""


async def close() -> None:
    """Close this event loop's connection (tests, shutdown)."""
    conn = _conns.pop(asyncio.get_running_loop(), None)
    if conn is not None:
        await conn.close()
