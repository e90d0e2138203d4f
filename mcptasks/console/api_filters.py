"""How the audit-review API's lists (:mod:`mcptasks.console.api`) are queried: filters and pages.

Each filter is declared once (:class:`QueryFilter`): the same declaration reads and checks the
query parameter, filters the queryset and describes the parameter in the OpenAPI schema.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.utils.dateparse import parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request


class NewestFirst(CursorPagination):
    """Opaque cursors, newest first; ``page_size`` up to 1000."""

    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 1000
    ordering = "-id"


class TaskPages(NewestFirst):
    """:class:`NewestFirst` by the tasks' sequence number."""

    ordering = "-seq"


@dataclass(frozen=True)
class QueryFilter:
    """One optional query parameter of a list: ``?name=value`` keeps the rows whose ``lookup`` is the value.

    ``type`` is how the value is read (:data:`OpenApiTypes.DATETIME`: an ISO 8601 time with an
    offset; ``INT``: a positive integer; ``STR``: at most ``max_length`` characters, one of
    ``choices`` when given). A malformed value is a 400 naming the parameter.
    """

    name: str
    lookup: str
    type: OpenApiTypes = OpenApiTypes.STR
    description: str = ""
    choices: Sequence[str] | None = None
    max_length: int = 64

    def parameter(self) -> OpenApiParameter:
        """The OpenAPI description of this parameter."""
        return OpenApiParameter(self.name, self.type, description=self.description,
                                enum=list(self.choices) if self.choices is not None else None)

    def value(self, request: Request) -> Any:
        """The parameter's value in ``request`` (None when absent or empty); raises ValidationError."""
        if self.type == OpenApiTypes.DATETIME:
            return _time(request, self.name)
        if self.type == OpenApiTypes.INT:
            return _int(request, self.name)
        value = _short(request, self.name, self.max_length)
        if value is not None and self.choices is not None and value not in self.choices:
            raise ValidationError({self.name: f"One of {', '.join(self.choices)}."})
        return value


def filtered(qs: Any, request: Request, filters: Sequence[QueryFilter]) -> Any:
    """``qs`` narrowed by every filter of ``filters`` that ``request`` sets (checked in order)."""
    for item in filters:
        value = item.value(request)
        if value is not None:
            qs = qs.filter(**{item.lookup: value})
    return qs


#: The common filters of the audit events and tasks: time window and principal.
TIME_FILTERS = (
    QueryFilter("since", "created_at__gte", OpenApiTypes.DATETIME, "Only rows created at or after this time."),
    QueryFilter("until", "created_at__lt", OpenApiTypes.DATETIME, "Only rows created before this time."),
    QueryFilter("principal", "principal_id", OpenApiTypes.INT, "Only this principal's rows (its id)."),
)


def _time(request: Request, name: str) -> dt.datetime | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = parse_datetime(raw)
    except ValueError:
        value = None
    try:
        # In UTC: PostgreSQL refuses offsets beyond +-15:59 that Python accepts (found by schemathesis).
        return value.astimezone(dt.UTC) if value is not None and value.tzinfo is not None else _bad_time(name)
    except (OverflowError, ValueError):
        return _bad_time(name)


def _bad_time(name: str) -> dt.datetime:
    raise ValidationError({name: "An ISO 8601 date-time with a UTC offset, e.g. 2026-01-01T00:00:00Z."})


def _int(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or len(raw) > 18:
        raise ValidationError({name: "A positive integer."})
    return int(raw)


def _short(request: Request, name: str, limit: int = 64) -> str | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if len(raw) > limit or "\x00" in raw:
        raise ValidationError({name: f"At most {limit} characters."})
    return raw
