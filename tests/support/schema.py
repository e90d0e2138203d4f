"""Validate every message the server sends against the official 2025-11-25 JSON schema."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

# The project carries its own copy of the published schemas (see spec/README.md): nothing
# outside the repository is read at test time.
SPEC_DIR = Path(__file__).resolve().parent / "spec"
SCHEMA_PATH = SPEC_DIR / "schema-2025-11-25.json"

RESULT_DEFS = {
    "initialize": "InitializeResult",
    "ping": "EmptyResult",
    "tools/list": "ListToolsResult",
    "tools/call": "CallToolResult",
    "tasks/get": "GetTaskResult",
    "tasks/list": "ListTasksResult",
    "tasks/cancel": "CancelTaskResult",
    "tasks/result": "GetTaskPayloadResult",
    "resources/list": "ListResourcesResult",
    "resources/templates/list": "ListResourceTemplatesResult",
    "resources/read": "ReadResourceResult",
    "resources/subscribe": "EmptyResult",
    "resources/unsubscribe": "EmptyResult",
    "prompts/list": "ListPromptsResult",
    "prompts/get": "GetPromptResult",
    "completion/complete": "CompleteResult",
    "logging/setLevel": "EmptyResult",
}
NOTIFICATION_DEFS = {
    "notifications/progress": "ProgressNotification",
    "notifications/message": "LoggingMessageNotification",
    "notifications/tasks/status": "TaskStatusNotification",
    "notifications/resources/updated": "ResourceUpdatedNotification",
}
REQUEST_DEFS = {
    "elicitation/create": "ElicitRequest",
    "sampling/createMessage": "CreateMessageRequest",
    "ping": "PingRequest",
}


@cache
def _schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


@cache
def _validator(defname: str) -> Draft202012Validator:
    schema = _schema()
    return Draft202012Validator({"$ref": f"#/$defs/{defname}", "$defs": schema["$defs"]})


def validate_def(defname: str, instance: Any) -> None:
    """Raise jsonschema.ValidationError unless ``instance`` matches ``$defs/defname``."""
    _validator(defname).validate(instance)


def validate_server_message(message: dict[str, Any], request_method: str | None = None) -> None:
    """Validate one server->client JSON-RPC message.

    ``request_method`` names the client request a response answers, so its ``result`` is checked
    against the right result type (a task-augmented tools/call answers CreateTaskResult).
    """
    if "method" in message and "id" in message:
        validate_def("JSONRPCRequest", message)
        defname = REQUEST_DEFS.get(message["method"])
        if defname:
            validate_def(defname, message)
        return
    if "method" in message:
        validate_def("JSONRPCNotification", message)
        defname = NOTIFICATION_DEFS.get(message["method"])
        if defname:
            validate_def(defname, message)
        return
    if "error" in message:
        validate_def("JSONRPCErrorResponse", message)
        return
    validate_def("JSONRPCResultResponse", message)
    if request_method:
        result = message["result"]
        defname = RESULT_DEFS.get(request_method)
        if request_method == "tools/call" and "task" in result and "content" not in result:
            defname = "CreateTaskResult"
        if defname:
            validate_def(defname, result)
