"""Pydantic models of the MCP 2025-11-25 request parameters and the task data types.

Only what the server reads is modelled strictly; every model tolerates unknown members
(``extra="allow"``) because MCP lets peers add fields.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

RELATED_TASK = "io.modelcontextprotocol/related-task"
MODEL_IMMEDIATE_RESPONSE = "io.modelcontextprotocol/model-immediate-response"

ProgressToken = StrictStr | StrictInt


class _Params(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    meta: dict[str, Any] | None = Field(default=None, alias="_meta")

    @property
    def progress_token(self) -> str | int | None:
        """The request's progressToken, if any."""
        if self.meta:
            token = self.meta.get("progressToken")
            if isinstance(token, str | int) and not isinstance(token, bool):
                return token
        return None


class EmptyParams(_Params):
    """Parameters of methods that take none."""


class Implementation(BaseModel):
    """A client's or server's name and version."""

    model_config = ConfigDict(extra="allow")
    name: StrictStr
    version: StrictStr
    title: StrictStr | None = None


class InitializeParams(_Params):
    """``initialize``."""

    protocolVersion: StrictStr
    capabilities: dict[str, Any]
    clientInfo: Implementation


class PaginatedParams(_Params):
    """Any ``*/list`` method."""

    cursor: StrictStr | None = None


class TaskMetadata(BaseModel):
    """The ``task`` member that turns a request into a task-augmented one."""

    model_config = ConfigDict(extra="allow")
    ttl: StrictInt | None = Field(default=None, ge=0)


class CallToolParams(_Params):
    """``tools/call``."""

    name: StrictStr
    arguments: dict[str, Any] | None = None
    task: TaskMetadata | None = None


#: What a task id this server issued looks like (``secrets.token_urlsafe``); anything else is
#: refused with -32602 before any I/O.
TASK_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"


class TaskIdParams(_Params):
    """``tasks/get``, ``tasks/result`` and ``tasks/cancel``."""

    taskId: StrictStr = Field(pattern=TASK_ID_PATTERN)


class ReadResourceParams(_Params):
    """``resources/read``, ``resources/subscribe`` and ``resources/unsubscribe``."""

    uri: StrictStr


class GetPromptParams(_Params):
    """``prompts/get``."""

    name: StrictStr
    arguments: dict[str, StrictStr] | None = None


class CompletionArgument(BaseModel):
    """The argument being completed."""

    name: StrictStr
    value: StrictStr


class CompletionRef(BaseModel):
    """What is being completed: a prompt or a resource template."""

    model_config = ConfigDict(extra="allow")
    type: Literal["ref/prompt", "ref/resource"]
    name: StrictStr | None = None
    uri: StrictStr | None = None


class CompleteParams(_Params):
    """``completion/complete``."""

    ref: CompletionRef
    argument: CompletionArgument
    context: dict[str, Any] | None = None


LoggingLevel = Literal["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]
LOG_LEVELS: tuple[str, ...] = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


class SetLevelParams(_Params):
    """``logging/setLevel``."""

    level: LoggingLevel


class CancelledParams(_Params):
    """``notifications/cancelled``."""

    requestId: StrictStr | StrictInt | None = None
    reason: StrictStr | None = None


class TaskStatus(StrEnum):
    """The five task states of the spec."""

    WORKING = "working"
    INPUT_REQUIRED = "input_required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATUSES = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED})

# The spec's lifecycle: working <-> input_required, either -> terminal, terminal is final.
ALLOWED_TRANSITIONS: dict[TaskStatus, frozenset[TaskStatus]] = {
    TaskStatus.WORKING: frozenset(
        {TaskStatus.INPUT_REQUIRED, TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED}
    ),
    TaskStatus.INPUT_REQUIRED: frozenset(
        {TaskStatus.WORKING, TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED}
    ),
    TaskStatus.COMPLETED: frozenset(),
    TaskStatus.FAILED: frozenset(),
    TaskStatus.CANCELLED: frozenset(),
}


def can_transition(src: str, dst: str) -> bool:
    """Whether the spec allows moving a task from ``src`` to ``dst``."""
    return TaskStatus(dst) in ALLOWED_TRANSITIONS[TaskStatus(src)]


def sources_for(dst: str) -> list[str]:
    """Every status from which ``dst`` may be reached (used for conditional UPDATEs)."""
    return [s.value for s, targets in ALLOWED_TRANSITIONS.items() if TaskStatus(dst) in targets]


class Task(BaseModel):
    """The Task data type as sent on the wire."""

    taskId: str
    status: TaskStatus
    statusMessage: str | None = None
    createdAt: str
    lastUpdatedAt: str
    ttl: int | None
    pollInterval: int | None = None

    def wire(self) -> dict[str, Any]:
        """JSON form: ``ttl`` always present (null = unlimited), other absent fields omitted."""
        data = self.model_dump(mode="json", exclude_none=True)
        data["ttl"] = self.ttl
        return data


def related_task_meta(task_id: str) -> dict[str, Any]:
    """The ``_meta`` member that ties a message to a task."""
    return {RELATED_TASK: {"taskId": task_id}}


# --- notifications a client sends --------------------------------------------------------------


class CancelledNotificationParams(_Params):
    """``notifications/cancelled``: the client gives up on one of its requests."""

    requestId: StrictStr | StrictInt
    reason: StrictStr | None = None


#: Notification methods this server acts on, with their parameter models. Others are accepted
#: (HTTP 202) and ignored, as the spec allows.
CLIENT_NOTIFICATIONS: dict[str, type[_Params]] = {
    "notifications/initialized": EmptyParams,
    "notifications/cancelled": CancelledNotificationParams,
}
