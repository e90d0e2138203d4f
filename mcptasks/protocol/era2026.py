"""MCP 2026-07-28 (stateless, per-request ``_meta``) and the ``io.modelcontextprotocol/tasks`` extension.

Pure models and constants of the second protocol era this server speaks. Nothing here imports
Django or performs I/O. The 2025-11-25 models stay in :mod:`.messages`; what the two eras share
(task statuses, the task id pattern) is imported from there, never redefined.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from mcptasks.protocol.errors import CAPABILITY_MISSING, MISSING_CLIENT_CAPABILITY, McpError
from mcptasks.protocol.messages import TASK_ID_PATTERN, Implementation

#: The revision this module models.
VERSION = "2026-07-28"
#: The tasks extension (SEP-2663) and how a peer declares it.
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"

# Per-request ``_meta`` keys (SEP-2575).
META_PROTOCOL_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_CLIENT_INFO = "io.modelcontextprotocol/clientInfo"
META_SERVER_INFO = "io.modelcontextprotocol/serverInfo"
META_LOG_LEVEL = "io.modelcontextprotocol/logLevel"
META_SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"

#: ``resultType`` values: a final result, an InputRequiredResult, a CreateTaskResult.
ResultType = Literal["complete", "input_required", "task"]
COMPLETE: ResultType = "complete"
INPUT_REQUIRED: ResultType = "input_required"
TASK: ResultType = "task"

#: Methods of 2025-11-25 that this era removed: unknown here (HTTP 404, -32601).
REMOVED_METHODS = frozenset({
    "initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe",
    "tasks/result", "tasks/list", "notifications/initialized",
})

#: Requests that may answer with an InputRequiredResult (SEP-2322).
INPUT_REQUIRED_METHODS = frozenset({"tools/call", "prompts/get", "resources/read"})

#: The ``Mcp-Name`` header's source member for each method that has one (SEP-2243).
NAME_SOURCE: dict[str, str] = {
    "tools/call": "name",
    "prompts/get": "name",
    "resources/read": "uri",
    "tasks/get": "taskId",
    "tasks/update": "taskId",
    "tasks/cancel": "taskId",
}

#: Bound on how many input responses one request may carry (each is stored and matched).
MAX_INPUT_RESPONSES = 64
#: Bound on an input key (keys are echoed back and matched, never interpreted).
INPUT_KEY_PATTERN = r"^[A-Za-z0-9_.:-]{1,64}$"


class RequestMeta(BaseModel):
    """The ``_meta`` every 2026-07-28 request carries."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    protocol_version: StrictStr = Field(alias=META_PROTOCOL_VERSION)
    client_capabilities: dict[str, Any] = Field(alias=META_CLIENT_CAPABILITIES)
    client_info: Implementation | None = Field(default=None, alias=META_CLIENT_INFO)
    log_level: StrictStr | None = Field(default=None, alias=META_LOG_LEVEL)

    def declares(self, capability: str) -> bool:
        """Whether the client declared ``capability`` for this request."""
        return isinstance(self.client_capabilities.get(capability), dict)

    def declares_tasks(self) -> bool:
        """Whether the client declared the tasks extension for this request."""
        ext = self.client_capabilities.get("extensions")
        return isinstance(ext, dict) and isinstance(ext.get(TASKS_EXTENSION), dict)


class _Params(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    meta: dict[str, Any] | None = Field(default=None, alias="_meta")


class InputRoundParams(_Params):
    """What a retried request adds (SEP-2322): the answers and the echoed state."""

    inputResponses: dict[StrictStr, dict[str, Any]] | None = Field(default=None, max_length=MAX_INPUT_RESPONSES)
    requestState: StrictStr | None = Field(default=None, max_length=4096)


class CallToolParams(InputRoundParams):
    """``tools/call`` (a legacy ``task`` member is ignored: the server decides)."""

    name: StrictStr
    arguments: dict[str, Any] | None = None


class TaskIdParams(_Params):
    """``tasks/get`` and ``tasks/cancel``."""

    taskId: StrictStr = Field(pattern=TASK_ID_PATTERN)


class TasksUpdateParams(TaskIdParams):
    """``tasks/update``: answers to a task's outstanding ``inputRequests``."""

    inputResponses: dict[StrictStr, dict[str, Any]] = Field(max_length=MAX_INPUT_RESPONSES)


class SubscriptionFilter(BaseModel):
    """What a ``subscriptions/listen`` stream opts in to."""

    model_config = ConfigDict(extra="allow")
    toolsListChanged: bool | None = None
    promptsListChanged: bool | None = None
    resourcesListChanged: bool | None = None
    resourceSubscriptions: list[StrictStr] | None = Field(default=None, max_length=100)
    taskIds: list[StrictStr] | None = Field(default=None, max_length=100)


class ListenParams(_Params):
    """``subscriptions/listen``."""

    notifications: SubscriptionFilter


def complete(result: dict[str, Any]) -> dict[str, Any]:
    """A final result of this era: ``resultType`` first, the rest unchanged."""
    return {"resultType": COMPLETE, **{k: v for k, v in result.items() if k != "resultType"}}


def input_required(requests: dict[str, dict[str, Any]], state: str | None) -> dict[str, Any]:
    """An InputRequiredResult: the outstanding requests by key and the state to echo."""
    out: dict[str, Any] = {"resultType": INPUT_REQUIRED, "inputRequests": requests}
    if state is not None:
        out["requestState"] = state
    return out


def task_wire(
    *, task_id: str, status: str, status_message: str | None, created_at: str, last_updated_at: str,
    ttl_ms: int | None, poll_interval_ms: int | None,
) -> dict[str, Any]:
    """The Task object of the extension: flat, with ``ttlMs``/``pollIntervalMs`` (not ``ttl``)."""
    out: dict[str, Any] = {
        "taskId": task_id, "status": status, "createdAt": created_at, "lastUpdatedAt": last_updated_at,
        "ttlMs": ttl_ms,
    }
    if status_message is not None:
        out["statusMessage"] = status_message
    if poll_interval_ms is not None:
        out["pollIntervalMs"] = poll_interval_ms
    return out


def era_error(err: McpError) -> McpError:
    """A stored error as this era words it (the engine's missing-capability code is -32021 here)."""
    if err.code == CAPABILITY_MISSING:
        data = err.data if isinstance(err.data, dict) and "requiredCapabilities" in err.data else None
        return McpError(MISSING_CLIENT_CAPABILITY, err.message, data or {"requiredCapabilities": {}})
    return err
