"""Version negotiation, the task state machine and the Task wire form."""

from __future__ import annotations

import itertools

import pytest
from pydantic import ValidationError

from mcptasks.protocol import versions
from mcptasks.protocol.messages import (
    ALLOWED_TRANSITIONS,
    RELATED_TASK,
    TERMINAL_STATUSES,
    CallToolParams,
    CancelledParams,
    GetPromptParams,
    InitializeParams,
    SetLevelParams,
    Task,
    TaskStatus,
    can_transition,
    related_task_meta,
    sources_for,
)

# --- versions ---------------------------------------------------------------------------------


def test_supported_and_latest() -> None:
    assert versions.LATEST == "2025-11-25"
    assert versions.SUPPORTED == ("2025-11-25", "2025-06-18", "2025-03-26")
    assert versions.ASSUMED_WHEN_ABSENT == "2025-03-26"


@pytest.mark.parametrize("v", ["2025-11-25", "2025-06-18", "2025-03-26"])
def test_negotiate_keeps_a_supported_version(v: str) -> None:
    assert versions.negotiate(v) == v
    assert versions.is_supported(v)


@pytest.mark.parametrize("v", ["2024-11-05", "2099-01-01", "", "garbage", None])
def test_negotiate_answers_latest_otherwise(v: str | None) -> None:
    assert versions.negotiate(v) == "2025-11-25"
    if v is not None:
        assert not versions.is_supported(v)


def test_feature_gates() -> None:
    assert versions.has_tasks("2025-11-25")
    assert not versions.has_tasks("2025-06-18") and not versions.has_tasks("2025-03-26")
    assert versions.has_elicitation("2025-06-18") and versions.has_elicitation("2025-11-25")
    assert not versions.has_elicitation("2025-03-26")


# --- state machine ------------------------------------------------------------------------------

W, IR, C, F, X = (TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED, TaskStatus.COMPLETED, TaskStatus.FAILED,
                 TaskStatus.CANCELLED)
# The spec's lifecycle (tasks-2025-11-25): working <-> input_required; both may end in any
# terminal status; terminal statuses never change.
SPEC_ALLOWED = {(W, IR), (W, C), (W, F), (W, X), (IR, W), (IR, C), (IR, F), (IR, X)}


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(TaskStatus, TaskStatus)))
def test_can_transition_matches_the_spec(src: TaskStatus, dst: TaskStatus) -> None:
    assert can_transition(src.value, dst.value) is ((src, dst) in SPEC_ALLOWED)


def test_terminal_statuses_and_sources() -> None:
    assert {TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED} == TERMINAL_STATUSES
    assert all(not ALLOWED_TRANSITIONS[s] for s in TERMINAL_STATUSES)
    assert not can_transition("working", "working")  # no self-loops
    assert sorted(sources_for("cancelled")) == ["input_required", "working"]
    assert sources_for("working") == ["input_required"]
    assert sources_for("input_required") == ["working"]
    with pytest.raises(ValueError):
        can_transition("working", "paused")
    assert [s.value for s in TaskStatus] == ["working", "input_required", "completed", "failed", "cancelled"]


# --- Task wire form -----------------------------------------------------------------------------


def test_task_wire_omits_absent_fields_but_keeps_null_ttl() -> None:
    t = Task(taskId="t1", status=TaskStatus.WORKING, createdAt="2025-11-25T10:00:00Z",
             lastUpdatedAt="2025-11-25T10:00:01Z", ttl=None)
    assert t.wire() == {"taskId": "t1", "status": "working", "createdAt": "2025-11-25T10:00:00Z",
                        "lastUpdatedAt": "2025-11-25T10:00:01Z", "ttl": None}
    t = Task(taskId="t2", status=TaskStatus.FAILED, statusMessage="boom", createdAt="a", lastUpdatedAt="b",
             ttl=60000, pollInterval=1000)
    assert t.wire() == {"taskId": "t2", "status": "failed", "statusMessage": "boom", "createdAt": "a",
                        "lastUpdatedAt": "b", "ttl": 60000, "pollInterval": 1000}


def test_related_task_meta() -> None:
    assert RELATED_TASK == "io.modelcontextprotocol/related-task"
    assert related_task_meta("abc") == {"io.modelcontextprotocol/related-task": {"taskId": "abc"}}


# --- param models ---------------------------------------------------------------------------------


def test_progress_token_keeps_its_type() -> None:
    assert CallToolParams.model_validate({"name": "x", "_meta": {"progressToken": 1}}).progress_token == 1
    assert CallToolParams.model_validate({"name": "x", "_meta": {"progressToken": "1"}}).progress_token == "1"
    assert CallToolParams.model_validate({"name": "x", "_meta": {"progressToken": True}}).progress_token is None
    assert CallToolParams.model_validate({"name": "x"}).progress_token is None


def test_param_models_are_strict_where_it_matters() -> None:
    with pytest.raises(ValidationError):
        CallToolParams.model_validate({"name": 5})
    with pytest.raises(ValidationError):
        CallToolParams.model_validate({"name": "x", "task": {"ttl": -1}})
    with pytest.raises(ValidationError):
        SetLevelParams.model_validate({"level": "verbose"})
    with pytest.raises(ValidationError):
        GetPromptParams.model_validate({"name": "p", "arguments": {"a": 1}})
    with pytest.raises(ValidationError):
        InitializeParams.model_validate({"protocolVersion": "2025-11-25", "capabilities": {}})
    ok = InitializeParams.model_validate({"protocolVersion": "2025-11-25", "capabilities": {},
                                          "clientInfo": {"name": "c", "version": "1"}, "extra": 1})
    assert ok.clientInfo.name == "c"
    assert CancelledParams.model_validate({"requestId": 3}).requestId == 3
    assert CallToolParams.model_validate({"name": "x", "task": {}}).task is not None
