"""What the operator surfaces (admin, dashboard, audit API) show, whoever the operator is.

* **CSV cells** that a spreadsheet would run as a formula (text starting with ``=``, ``+``,
  ``-``, ``@``, or a tab or carriage return) are prefixed with ``'`` (OWASP "CSV injection"):
  principal names and identifiers come from OAuth clients and identity providers.
* **CSV columns**: one per field. An object field (the principal, an audit event's ``data``)
  becomes one column per key (``data.tool``, ``principal.name``); only values nested deeper
  are JSON text in their cell.
* **Worker ids** embed the worker's host name and pid; workers serve every tenant, so only
  operators who see every tenant see them. A tenant-scoped operator gets a stable opaque label
  (tasks run by one worker still share it) that reveals neither.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from django.conf import settings

#: First characters that make a spreadsheet read a cell as a formula (OWASP).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """``value`` for a CSV cell: text that would be read as a formula gets a ``'`` first."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def csv_row(values: list[Any]) -> list[Any]:
    """:func:`csv_cell` of every cell."""
    return [csv_cell(v) for v in values]


#: Most ``data.<key>`` columns of an export; keys beyond go to one ``data.other`` JSON column.
MAX_DATA_COLUMNS = 200


def json_keys(qs: Any, field: str = "data", limit: int = MAX_DATA_COLUMNS) -> tuple[list[str], bool]:
    """The distinct top-level keys of the JSON ``field`` over ``qs`` (sorted, at most ``limit``),
    and whether there were more. Asked of PostgreSQL, so a CSV's header is known before its rows
    stream."""
    from django.db import connections
    from django.db.models import F, Func, TextField

    if connections[qs.db].vendor == "postgresql":
        keys = (qs.order_by().annotate(_key=Func(F(field), function="jsonb_object_keys", output_field=TextField()))
                .values_list("_key", flat=True).distinct().order_by("_key"))
        found = list(keys[: limit + 1])
    else:  # SQLite (development): one pass over the rows, keeping only the key set
        seen: set[str] = set()
        for value in qs.order_by().values_list(field, flat=True).iterator(chunk_size=2000):
            if isinstance(value, dict):
                seen.update(str(k) for k in value)
        found = sorted(seen)[: limit + 1]
    return found[:limit], len(found) > limit


def flat_cell(value: Any) -> Any:
    """One cell: nested objects and lists as JSON text, None as empty."""
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return value


def flat_object(value: Any, keys: list[str], *, other: bool) -> list[Any]:
    """The cells of ``value``'s ``keys`` (and, when ``other``, a JSON cell of the remaining keys)."""
    data = value if isinstance(value, dict) else {}
    cells = [flat_cell(data.get(k)) for k in keys]
    if other:
        rest = {k: v for k, v in data.items() if k not in set(keys)}
        cells.append(flat_cell(rest) if rest else "")
    return cells


def flat_header(prefix: str, keys: list[str], *, other: bool) -> list[str]:
    """Column names ``prefix.key`` (and ``prefix.other``)."""
    return [f"{prefix}.{k}" for k in keys] + ([f"{prefix}.other"] if other else [])


def worker_label(worker_id: str | None, *, all_tenants: bool) -> str:
    """The worker id for an all-tenant operator, else an opaque label of it ("" for none)."""
    if not worker_id:
        return ""
    if all_tenants:
        return worker_id
    digest = hmac.new(str(settings.SECRET_KEY).encode(), b"worker:" + worker_id.encode(), hashlib.sha256)
    return "worker-" + digest.hexdigest()[:12]
