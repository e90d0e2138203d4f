"""The pure 2026-07-28 models: per-request _meta, the extension's task object, result helpers."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mcptasks.protocol import era2026
from mcptasks.protocol.era2026 import (
    TASKS_EXTENSION,
    CallToolParams,
    RequestMeta,
    TasksUpdateParams,
    input_required,
    task_wire,
)
from mcptasks.protocol.errors import HEADER_MISMATCH, MISSING_CLIENT_CAPABILITY, UNSUPPORTED_PROTOCOL_VERSION


def meta(**caps: object) -> dict[str, object]:
    return {era2026.META_PROTOCOL_VERSION: "2026-07-28", era2026.META_CLIENT_CAPABILITIES: caps}


def test_error_codes_are_the_revisions() -> None:
    assert (HEADER_MISMATCH, MISSING_CLIENT_CAPABILITY, UNSUPPORTED_PROTOCOL_VERSION) == (-32020, -32021, -32022)


def test_request_meta_requires_version_and_capabilities_but_not_client_info() -> None:
    parsed = RequestMeta.model_validate(meta(elicitation={}))
    assert parsed.protocol_version == "2026-07-28" and parsed.client_info is None
    assert parsed.declares("elicitation") and not parsed.declares("sampling")
    for bad in ({era2026.META_CLIENT_CAPABILITIES: {}}, {era2026.META_PROTOCOL_VERSION: "2026-07-28"},
                {**meta(), era2026.META_CLIENT_CAPABILITIES: []}, {**meta(), era2026.META_PROTOCOL_VERSION: 7}):
        with pytest.raises(ValidationError):
            RequestMeta.model_validate(bad)


def test_tasks_extension_is_declared_only_as_an_object_under_extensions() -> None:
    assert RequestMeta.model_validate(meta(extensions={TASKS_EXTENSION: {}})).declares_tasks()
    assert not RequestMeta.model_validate(meta(extensions={TASKS_EXTENSION: True})).declares_tasks()
    assert not RequestMeta.model_validate(meta(tasks={})).declares_tasks()  # the 2025 capability is not it
    assert not RequestMeta.model_validate(meta()).declares_tasks()


def test_input_round_members_are_bounded() -> None:
    CallToolParams.model_validate({"name": "t", "inputResponses": {"k": {}}, "requestState": "s"})
    with pytest.raises(ValidationError):
        CallToolParams.model_validate({"name": "t", "requestState": "x" * 5000})
    with pytest.raises(ValidationError):
        TasksUpdateParams.model_validate({"taskId": "abc", "inputResponses": {
            str(i): {} for i in range(era2026.MAX_INPUT_RESPONSES + 1)}})
    with pytest.raises(ValidationError):
        TasksUpdateParams.model_validate({"taskId": "not a task id!", "inputResponses": {}})


def test_task_wire_is_flat_with_ms_names_and_no_legacy_names() -> None:
    wire = task_wire(task_id="t", status="working", status_message=None, created_at="c", last_updated_at="u",
                     ttl_ms=None, poll_interval_ms=500)
    assert wire == {"taskId": "t", "status": "working", "createdAt": "c", "lastUpdatedAt": "u", "ttlMs": None,
                    "pollIntervalMs": 500}


def test_result_helpers_put_result_type_first() -> None:
    assert list(era2026.complete({"content": [], "resultType": "x"})) == ["resultType", "content"]
    assert era2026.complete({})["resultType"] == "complete"
    assert input_required({"k": {"method": "roots/list", "params": {}}}, None) == {
        "resultType": "input_required", "inputRequests": {"k": {"method": "roots/list", "params": {}}}}
