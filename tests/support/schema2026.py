"""Validate what the 2026-07-28 era sends against the published 2026-07-28 schema (a copy in spec/)."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from jsonschema import Draft202012Validator

from tests.support.schema import SPEC_DIR

SCHEMA_PATH = SPEC_DIR / "schema-2026-07-28.json"

#: Result types of the core methods (the tasks extension's results are checked field by field).
RESULT_DEFS = {
    "server/discover": "DiscoverResult",
    "tools/list": "ListToolsResult",
    "resources/list": "ListResourcesResult",
    "resources/read": "ReadResourceResult",
    "prompts/list": "ListPromptsResult",
    "prompts/get": "GetPromptResult",
    "completion/complete": "CompleteResult",
}


@cache
def _validator(defname: str) -> Draft202012Validator:
    schema = json.loads(SCHEMA_PATH.read_text())
    return Draft202012Validator({"$ref": f"#/$defs/{defname}", "$defs": schema["$defs"]})


def validate_2026(defname: str, instance: Any) -> None:
    """Raise jsonschema.ValidationError unless ``instance`` matches ``$defs/defname`` of 2026-07-28."""
    _validator(defname).validate(instance)


def validate_response(message: dict[str, Any], method: str) -> None:
    """A response of this era: the JSON-RPC envelope, then the method's result type if known."""
    if "error" in message:
        validate_2026("JSONRPCErrorResponse", message)
        return
    validate_2026("JSONRPCResultResponse", message)
    defname = RESULT_DEFS.get(method)
    if defname:
        validate_2026(defname, message["result"])
    elif method == "tools/call" and message["result"].get("resultType") == "complete":
        validate_2026("CallToolResult", message["result"])
    elif message["result"].get("resultType") == "input_required":
        validate_2026("InputRequiredResult", message["result"])
