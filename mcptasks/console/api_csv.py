"""CSV of the audit-review API (:mod:`mcptasks.console.api`): ``?format=csv`` streams every
matching row, one column per field (flattening and formula-cell defusing in :mod:`.operators`)."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from typing import Any

from django.http import StreamingHttpResponse
from rest_framework.renderers import BaseRenderer

from mcptasks.console import operators


class CSVRenderer(BaseRenderer):
    """Declares ``text/csv`` (the views stream the rows themselves, see :func:`streamed`)."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        """Errors (the only thing rendered through here) as one CSV cell."""
        buf: list[str] = []
        writer = csv.writer(_Lines(buf))
        writer.writerow(["error"])
        writer.writerow([json.dumps(data)])
        return "".join(buf).encode()


class _Lines:
    """A file for :func:`csv.writer` that hands each written line back (and keeps it in ``buf`` if given)."""

    def __init__(self, buf: list[str] | None = None) -> None:
        self.buf = buf

    def write(self, value: str) -> str:
        if self.buf is not None:
            self.buf.append(value)
        return value


def streamed(qs: Any, pages: Iterable[Any], *, serialize: Any, fields: tuple[str, ...],
             json_fields: tuple[str, ...], filename: str) -> StreamingHttpResponse:
    """Every row of ``pages`` (the rows of ``qs``) as a CSV download, one column per field.

    The principal becomes ``principal.id``/``principal.name``, each key of a JSON field in
    ``json_fields`` (an event's ``data``) its own ``data.<key>`` column, the keys found in ``qs``.
    ``serialize`` turns a row into its serializer's data.
    """
    writer = csv.writer(_Lines())
    objects: dict[str, tuple[list[str], bool]] = {"principal": (["id", "name"], False)}
    for name in json_fields:
        objects[name] = operators.json_keys(qs, name)
    header: list[str] = []
    for f in fields:
        header += operators.flat_header(f, *objects[f][:1], other=objects[f][1]) if f in objects else [f]

    def rows() -> Iterator[str]:
        yield writer.writerow(operators.csv_row(header))
        for obj in pages:
            data = serialize(obj)
            cells: list[Any] = []
            for f in fields:
                if f in objects:
                    keys, other = objects[f]
                    cells += operators.flat_object(data[f], keys, other=other)
                else:
                    cells.append(operators.flat_cell(data[f]))
            # Names come from OAuth clients and identity providers: no formula cells.
            yield writer.writerow(operators.csv_row(cells))

    response = StreamingHttpResponse(rows(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}.csv"'
    return response
