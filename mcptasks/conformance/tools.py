"""The fixture set of the official conformance suite (@modelcontextprotocol/conformance 0.1.16).

Names and outputs match what the suite's scenarios call and check; tests assert them exactly.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from mcptasks.tools.registry import (
    ToolContext,
    ToolResult,
    audio,
    image,
    prompt,
    resource,
    resource_template,
    text,
    tool,
)

PNG_1X1 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
WAV_MIN = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="
RECONNECTION_TEXT = (
    "Reconnection test completed successfully. If you received this, the client properly reconnected "
    "after stream closure."
)


@tool(description="Returns a simple text response")
async def test_simple_text() -> str:
    return "This is a simple text response for testing."


@tool(description="Returns an image")
async def test_image_content() -> dict[str, Any]:
    return {"content": [image(PNG_1X1, "image/png")]}


@tool(description="Returns audio")
async def test_audio_content() -> dict[str, Any]:
    return {"content": [audio(WAV_MIN, "audio/wav")]}


@tool(description="Returns an embedded resource")
async def test_embedded_resource() -> dict[str, Any]:
    return {
        "content": [
            {
                "type": "resource",
                "resource": {
                    "uri": "test://embedded-resource",
                    "mimeType": "text/plain",
                    "text": "This is an embedded resource content.",
                },
            }
        ]
    }


@tool(description="Returns text, image and resource content together")
async def test_multiple_content_types() -> dict[str, Any]:
    return {
        "content": [
            text("Multiple content types test:"),
            image(PNG_1X1, "image/png"),
            {
                "type": "resource",
                "resource": {
                    "uri": "test://mixed-content-resource",
                    "mimeType": "application/json",
                    "text": json.dumps({"test": "data", "value": 123}, separators=(",", ":")),
                },
            },
        ]
    }


@tool(description="Sends log notifications while it runs")
async def test_tool_with_logging(ctx: ToolContext) -> str:
    await ctx.log("info", "Tool execution started")
    await asyncio.sleep(0.05)
    await ctx.log("info", "Tool processing data")
    await asyncio.sleep(0.05)
    await ctx.log("info", "Tool execution completed")
    return "Tool with logging executed successfully"


@tool(description="Reports progress while it runs")
async def test_tool_with_progress(ctx: ToolContext) -> str:
    await ctx.report_progress(0, 100)
    await asyncio.sleep(0.05)
    await ctx.report_progress(50, 100)
    await asyncio.sleep(0.05)
    await ctx.report_progress(100, 100)
    return str(ctx.request_id)


@tool(description="Always returns an error result")
async def test_error_handling() -> ToolResult:
    return ToolResult(content=[text("This tool intentionally returns an error for testing")], is_error=True)


@tool(description="Asks the client to sample")
async def test_sampling(prompt: str, ctx: ToolContext) -> str:
    result = await ctx.sample(
        [{"role": "user", "content": {"type": "text", "text": prompt}}], max_tokens=100
    )
    content = result.get("content") or {}
    if isinstance(content, list):
        content = content[0] if content else {}
    return f"LLM response: {content.get('text', '')}"


@tool(description="Asks the user for information")
async def test_elicitation(message: str, ctx: ToolContext) -> str:
    result = await ctx.elicit(
        message,
        {
            "type": "object",
            "properties": {
                "username": {"type": "string", "description": "User's response"},
                "email": {"type": "string", "description": "User's email address"},
            },
            "required": ["username", "email"],
        },
    )
    content = json.dumps(result.get("content"), separators=(",", ":"))
    return f"User response: action={result.get('action')}, content={content}"


@tool(description="Elicitation with default values (SEP-1034)")
async def test_elicitation_sep1034_defaults(ctx: ToolContext) -> str:
    result = await ctx.elicit(
        "Please review and update the form fields with defaults",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "User name", "default": "John Doe"},
                "age": {"type": "integer", "description": "User age", "default": 30},
                "score": {"type": "number", "description": "User score", "default": 95.5},
                "status": {
                    "type": "string",
                    "description": "User status",
                    "enum": ["active", "inactive", "pending"],
                    "default": "active",
                },
                "verified": {"type": "boolean", "description": "Verification status", "default": True},
            },
            "required": [],
        },
    )
    content = json.dumps(result.get("content"), separators=(",", ":"))
    return f"Elicitation completed: action={result.get('action')}, content={content}"


@tool(description="Elicitation with every enum style (SEP-1330)")
async def test_elicitation_sep1330_enums(ctx: ToolContext) -> str:
    result = await ctx.elicit(
        "Please select options from the enum fields",
        {
            "type": "object",
            "properties": {
                "untitledSingle": {
                    "type": "string",
                    "description": "Select one option",
                    "enum": ["option1", "option2", "option3"],
                },
                "titledSingle": {
                    "type": "string",
                    "description": "Select one option with titles",
                    "oneOf": [
                        {"const": "value1", "title": "First Option"},
                        {"const": "value2", "title": "Second Option"},
                        {"const": "value3", "title": "Third Option"},
                    ],
                },
                "legacyEnum": {
                    "type": "string",
                    "description": "Select one option (legacy)",
                    "enum": ["opt1", "opt2", "opt3"],
                    "enumNames": ["Option One", "Option Two", "Option Three"],
                },
                "untitledMulti": {
                    "type": "array",
                    "description": "Select multiple options",
                    "minItems": 1,
                    "maxItems": 3,
                    "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
                },
                "titledMulti": {
                    "type": "array",
                    "description": "Select multiple options with titles",
                    "minItems": 1,
                    "maxItems": 3,
                    "items": {
                        "anyOf": [
                            {"const": "value1", "title": "First Choice"},
                            {"const": "value2", "title": "Second Choice"},
                            {"const": "value3", "title": "Third Choice"},
                        ]
                    },
                },
            },
            "required": [],
        },
    )
    content = json.dumps(result.get("content"), separators=(",", ":"))
    return f"Elicitation completed: action={result.get('action')}, content={content}"


JSON_SCHEMA_2020_12 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    # SEP-2106 (2026-07-28): composition and conditional keywords must survive tools/list too.
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}


@tool(description="Tool with JSON Schema 2020-12 features", input_schema=JSON_SCHEMA_2020_12)
async def json_schema_2020_12_tool(**arguments: Any) -> str:
    return f"JSON Schema 2020-12 tool called with: {json.dumps(arguments)}"


@tool(description="Closes the SSE stream mid-call; the client must reconnect to get the result")
async def test_reconnection(ctx: ToolContext) -> str:
    await ctx.close_stream()
    await asyncio.sleep(0.1)
    return RECONNECTION_TEXT


# --- resources ---------------------------------------------------------------------------------


@resource("test://static-text", name="static-text", description="A static text resource", mime_type="text/plain")
def static_text() -> str:
    return "This is the content of the static text resource."


@resource("test://static-binary", name="static-binary", description="A static binary resource",
          mime_type="image/png")
def static_binary() -> dict[str, Any]:
    return {"mimeType": "image/png", "blob": PNG_1X1}


@resource("test://watched-resource", name="watched-resource", description="A resource clients can subscribe to",
          mime_type="text/plain")
def watched_resource() -> str:
    return "Watched resource content"


@resource_template("test://template/{id}/data", name="template", description="A templated resource",
                   mime_type="application/json")
def template_data(id: str) -> str:
    return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"}, separators=(",", ":"))


# --- prompts -----------------------------------------------------------------------------------


@prompt(description="A simple prompt without arguments", arguments=[])
def test_simple_prompt() -> list[dict[str, Any]]:
    return [{"role": "user", "content": text("This is a simple prompt for testing.")}]


@prompt(
    description="A prompt with required arguments",
    arguments=[
        {"name": "arg1", "description": "First test argument", "required": True},
        {"name": "arg2", "description": "Second test argument", "required": True},
    ],
    complete={"arg1": lambda v: [s for s in ("test", "testing", "tested") if s.startswith(v)]},
)
def test_prompt_with_arguments(arg1: str, arg2: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text(f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'")}]


@prompt(
    description="A prompt that embeds a resource",
    arguments=[{"name": "resourceUri", "description": "URI of the resource to embed", "required": True}],
)
def test_prompt_with_embedded_resource(resourceUri: str) -> list[dict[str, Any]]:
    return [
        {
            "role": "user",
            "content": {
                "type": "resource",
                "resource": {"uri": resourceUri, "mimeType": "text/plain",
                             "text": "Embedded resource content for testing."},
            },
        },
        {"role": "user", "content": text("Please process the embedded resource above.")},
    ]


@prompt(description="A prompt that contains an image", arguments=[])
def test_prompt_with_image() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": image(PNG_1X1, "image/png")},
        {"role": "user", "content": text("Please analyze the image above.")},
    ]


# The 2026-07-28 scenarios' fixtures live in their own module; importing it registers them.
from mcptasks.conformance import tools_2026  # noqa: E402, F401
