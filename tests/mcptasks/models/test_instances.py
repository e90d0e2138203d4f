"""Model instances built positionally (:mod:`mcptasks.models.instances`) are the keyword-built ones."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import models

from mcptasks.models import AuditEvent, McpSession, Task, instances

NOW = dt.datetime(2026, 11, 29, 7, 30, 1, 123456, tzinfo=dt.UTC)


def _fields(obj: models.Model) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}


@pytest.mark.parametrize(("model", "values"), [
    (Task, {"task_id": "t" * 32, "tenant_id": 3, "principal_id": 4, "session_id": "s" * 32, "tool_name": "echo",
            "params": {"name": "echo", "arguments": {"x": [1, 2]}}, "request_id": "r-1", "progress_token": 7,
            "ttl_ms": 60_000, "poll_interval_ms": 1000, "created_at": NOW, "last_updated_at": NOW,
            "expires_at": NOW + dt.timedelta(minutes=1), "max_attempts": 3, "stream_id": None,
            "idempotency_key": "k" * 64, "traceparent": "00-abc-def-01"}),
    (Task, {"task_id": "u" * 32, "tenant_id": 3, "principal_id": 4, "session_id": "s", "tool_name": "echo",
            "created_at": NOW, "last_updated_at": NOW}),
    (AuditEvent, {"tenant_id": 3, "principal_id": None, "chain": 3, "principal_ref": None, "action": "task.create",
                  "task_id": "t" * 32, "data": {"tool": "echo", "ttl": 5}, "created_at": NOW}),
    (McpSession, {"id": "s" * 32, "tenant_id": 1, "principal_id": 2}),
])
def test_every_field_is_what_the_keyword_constructor_gives(model: type[models.Model], values: dict[str, Any]) -> None:
    built = instances.build(model, dict(values))
    keyword = model(**values)
    assert type(built) is model
    assert _fields(built) == _fields(keyword)
    assert built._state.adding and built._state.db is None  # unsaved, as a keyword-built row
    for name, value in values.items():
        assert getattr(built, name) == value


def test_a_callable_default_is_called_for_each_row() -> None:
    values = {"tenant_id": 1, "principal_id": 2, "session_id": "s", "tool_name": "echo", "created_at": NOW,
              "last_updated_at": NOW}
    one, two = instances.build(Task, dict(values)), instances.build(Task, dict(values))
    assert one.task_id and two.task_id and one.task_id != two.task_id  # new_task_id, not one shared value
    assert one.params == {} and one.params is not two.params  # dict(): never a dict shared between rows


def test_an_unknown_or_related_name_is_refused() -> None:
    with pytest.raises(TypeError, match="no concrete field with attname 'tenant'"):
        instances.build(Task, {"tenant": 1})
    with pytest.raises(TypeError, match="'nonsense'"):
        instances.build(AuditEvent, {"action": "x", "nonsense": 1})
