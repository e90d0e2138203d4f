"""Exact outputs of the conformance fixtures (the suite itself only checks them loosely).

Literals are those of the suite's scenario descriptions / reference server (0.1.16).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.client import McpClient

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
WAV = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="

CONFORMANCE_TOOLS = {
    "test_simple_text", "test_image_content", "test_audio_content", "test_embedded_resource",
    "test_multiple_content_types", "test_tool_with_logging", "test_tool_with_progress", "test_error_handling",
    "test_sampling", "test_elicitation", "test_elicitation_sep1034_defaults", "test_elicitation_sep1330_enums",
    "json_schema_2020_12_tool", "test_reconnection",
}


def assert_echo(result: dict[str, Any], prefix: str, content: dict[str, Any]) -> None:
    """The result is one text block: ``prefix`` + the client's content as compact JSON.

    Key order is not compared: PostgreSQL's jsonb (where the answer is stored) sorts keys.
    """
    assert list(result) == ["content"] and len(result["content"]) == 1
    block = result["content"][0]
    assert block["type"] == "text" and block["text"].startswith(prefix), block
    rest = block["text"][len(prefix):]
    assert json.loads(rest) == content
    assert ", " not in rest and ": " not in rest  # compact separators


def test_tools_are_listed_on_the_first_page_with_descriptions(client: McpClient) -> None:
    tools = {t["name"]: t for t in client.request("tools/list").result["tools"]}
    assert CONFORMANCE_TOOLS <= set(tools)
    for name in CONFORMANCE_TOOLS:
        assert tools[name]["description"], name
        assert tools[name]["inputSchema"]["type"] == "object", name
    assert tools["json_schema_2020_12_tool"]["description"] == "Tool with JSON Schema 2020-12 features"
    from mcptasks.conformance.tools import JSON_SCHEMA_2020_12

    schema = tools["json_schema_2020_12_tool"]["inputSchema"]
    assert schema == JSON_SCHEMA_2020_12  # verbatim: nothing stripped (SEP-1613, SEP-2106)
    assert schema["$defs"]["address"]["$anchor"] == "addressDef"
    assert {"allOf", "if", "then", "else", "$schema", "additionalProperties"} <= set(schema)
    assert tools["test_sampling"]["inputSchema"]["required"] == ["prompt"]
    assert tools["test_elicitation"]["inputSchema"]["required"] == ["message"]


def test_simple_text_without_arguments_key(client: McpClient) -> None:
    reply = client.request("tools/call", {"name": "test_simple_text"})
    assert reply.result == {"content": [{"type": "text", "text": "This is a simple text response for testing."}]}


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("test_image_content", [{"type": "image", "data": PNG, "mimeType": "image/png"}]),
        ("test_audio_content", [{"type": "audio", "data": WAV, "mimeType": "audio/wav"}]),
        ("test_embedded_resource", [{"type": "resource", "resource": {
            "uri": "test://embedded-resource", "mimeType": "text/plain",
            "text": "This is an embedded resource content."}}]),
        ("test_multiple_content_types", [
            {"type": "text", "text": "Multiple content types test:"},
            {"type": "image", "data": PNG, "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "test://mixed-content-resource", "mimeType": "application/json",
                                              "text": '{"test":"data","value":123}'}},
        ]),
    ],
)
def test_content_fixtures(client: McpClient, name: str, content: list[dict[str, Any]]) -> None:
    reply = client.call(name, {})
    assert reply.result == {"content": content}


def test_error_handling_is_an_error_result(client: McpClient) -> None:
    reply = client.call("test_error_handling", {})
    assert reply.result == {
        "isError": True,
        "content": [{"type": "text", "text": "This tool intentionally returns an error for testing"}],
    }


def test_tool_with_logging(client: McpClient) -> None:
    assert client.request("logging/setLevel", {"level": "debug"}).result == {}
    reply = client.call("test_tool_with_logging", {})
    logs = [n["params"] for n in reply.notifications if n["method"] == "notifications/message"]
    assert [(p["level"], p["data"]) for p in logs] == [
        ("info", "Tool execution started"), ("info", "Tool processing data"), ("info", "Tool execution completed"),
    ]
    assert reply.result == {"content": [{"type": "text", "text": "Tool with logging executed successfully"}]}


def test_tool_with_progress_echoes_integer_token(client: McpClient) -> None:
    reply = client.call("test_tool_with_progress", {}, meta={"progressToken": 1}, rid=1)
    progress = [n["params"] for n in reply.notifications if n["method"] == "notifications/progress"]
    assert [(p["progressToken"], p["progress"], p["total"]) for p in progress] == [(1, 0, 100), (1, 50, 100),
                                                                                   (1, 100, 100)]
    assert all(type(p["progressToken"]) is int for p in progress)
    assert reply.result == {"content": [{"type": "text", "text": "1"}]}


def test_sampling(client: McpClient) -> None:
    seen: list[dict[str, Any]] = []

    def answer(req: dict[str, Any]) -> dict[str, Any]:
        seen.append(req)
        return {"model": "test-model", "stopReason": "endTurn", "role": "assistant",
                "content": {"type": "text", "text": "This is a test response from the client"}}

    reply = client.call("test_sampling", {"prompt": "Test prompt for sampling"}, on_request=answer)
    assert [r["method"] for r in seen] == ["sampling/createMessage"]
    params = seen[0]["params"]
    assert params["messages"] == [{"role": "user", "content": {"type": "text", "text": "Test prompt for sampling"}}]
    assert params["maxTokens"] == 100 and type(params["maxTokens"]) is int
    expected = "LLM response: This is a test response from the client"
    assert reply.result == {"content": [{"type": "text", "text": expected}]}


def test_elicitation(client: McpClient) -> None:
    seen: list[dict[str, Any]] = []
    content = {"username": "testuser", "email": "test@example.com"}

    def answer(req: dict[str, Any]) -> dict[str, Any]:
        seen.append(req)
        return {"action": "accept", "content": content}

    reply = client.call("test_elicitation", {"message": "Please provide your information"}, on_request=answer)
    assert [r["method"] for r in seen] == ["elicitation/create"]
    params = seen[0]["params"]
    assert params["message"] == "Please provide your information"
    assert params.get("mode", "form") == "form"
    assert params["requestedSchema"] == {
        "type": "object",
        "properties": {
            "username": {"type": "string", "description": "User's response"},
            "email": {"type": "string", "description": "User's email address"},
        },
        "required": ["username", "email"],
    }
    assert_echo(reply.result, "User response: action=accept, content=", content)


def test_elicitation_sep1034_defaults(client: McpClient) -> None:
    seen: list[dict[str, Any]] = []
    content = {"name": "Jane Smith", "age": 25, "score": 88, "status": "inactive", "verified": False}
    reply = client.call("test_elicitation_sep1034_defaults", {},
                        on_request=lambda r: seen.append(r) or {"action": "accept", "content": content})
    params = seen[0]["params"]
    assert params["message"] == "Please review and update the form fields with defaults"
    assert params["requestedSchema"] == {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "User name", "default": "John Doe"},
            "age": {"type": "integer", "description": "User age", "default": 30},
            "score": {"type": "number", "description": "User score", "default": 95.5},
            "status": {"type": "string", "description": "User status", "enum": ["active", "inactive", "pending"],
                       "default": "active"},
            "verified": {"type": "boolean", "description": "Verification status", "default": True},
        },
        "required": [],
    }
    assert_echo(reply.result, "Elicitation completed: action=accept, content=", content)


def test_elicitation_sep1330_enums(client: McpClient) -> None:
    seen: list[dict[str, Any]] = []
    content = {"untitledSingle": "option1", "titledSingle": "value1", "legacyEnum": "opt1",
               "untitledMulti": ["option1", "option2"], "titledMulti": ["value1", "value2"]}
    reply = client.call("test_elicitation_sep1330_enums", {},
                        on_request=lambda r: seen.append(r) or {"action": "accept", "content": content})
    params = seen[0]["params"]
    assert params["message"] == "Please select options from the enum fields"
    props = params["requestedSchema"]["properties"]
    assert props["untitledSingle"] == {"type": "string", "description": "Select one option",
                                       "enum": ["option1", "option2", "option3"]}
    assert props["titledSingle"] == {"type": "string", "description": "Select one option with titles", "oneOf": [
        {"const": "value1", "title": "First Option"}, {"const": "value2", "title": "Second Option"},
        {"const": "value3", "title": "Third Option"}]}
    assert props["legacyEnum"] == {"type": "string", "description": "Select one option (legacy)",
                                   "enum": ["opt1", "opt2", "opt3"],
                                   "enumNames": ["Option One", "Option Two", "Option Three"]}
    assert props["untitledMulti"] == {"type": "array", "description": "Select multiple options", "minItems": 1,
                                      "maxItems": 3,
                                      "items": {"type": "string", "enum": ["option1", "option2", "option3"]}}
    assert props["titledMulti"] == {"type": "array", "description": "Select multiple options with titles",
                                    "minItems": 1, "maxItems": 3, "items": {"anyOf": [
                                        {"const": "value1", "title": "First Choice"},
                                        {"const": "value2", "title": "Second Choice"},
                                        {"const": "value3", "title": "Third Choice"}]}}
    assert params["requestedSchema"]["required"] == []
    assert_echo(reply.result, "Elicitation completed: action=accept, content=", content)


def test_reconnection_result_after_resume(client: McpClient) -> None:
    reply = client.call("test_reconnection", {}, rid=1)
    assert reply.message is None and len(reply.events) == 1 and reply.events[0].data == ""
    resumed = client.resume(reply.events[0].id or "", method="tools/call")
    assert resumed.message == {"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": (
        "Reconnection test completed successfully. If you received this, the client properly reconnected "
        "after stream closure.")}]}}


def test_resources(client: McpClient) -> None:
    resources = {r["uri"]: r for r in client.request("resources/list").result["resources"]}
    assert resources["test://static-text"]["name"] == "static-text"
    assert resources["test://static-text"]["mimeType"] == "text/plain"
    assert resources["test://static-binary"]["name"] == "static-binary"
    assert resources["test://static-binary"]["mimeType"] == "image/png"
    assert resources["test://watched-resource"]["mimeType"] == "text/plain"
    assert all(r["description"] for uri, r in resources.items() if uri.startswith("test://"))
    read = client.request("resources/read", {"uri": "test://static-text"}).result
    assert read == {"contents": [{"uri": "test://static-text", "mimeType": "text/plain",
                                  "text": "This is the content of the static text resource."}]}
    read = client.request("resources/read", {"uri": "test://static-binary"}).result
    assert read == {"contents": [{"uri": "test://static-binary", "mimeType": "image/png", "blob": PNG}]}
    read = client.request("resources/read", {"uri": "test://watched-resource"}).result
    assert read == {"contents": [{"uri": "test://watched-resource", "mimeType": "text/plain",
                                  "text": "Watched resource content"}]}
    read = client.request("resources/read", {"uri": "test://template/123/data"}).result
    assert read == {"contents": [{"uri": "test://template/123/data", "mimeType": "application/json",
                                  "text": '{"id":"123","templateTest":true,"data":"Data for ID: 123"}'}]}
    templates = client.request("resources/templates/list").result["resourceTemplates"]
    tmpl = next(t for t in templates if t["uriTemplate"] == "test://template/{id}/data")
    assert tmpl["name"] == "template" and tmpl["mimeType"] == "application/json"
    assert client.request("resources/subscribe", {"uri": "test://watched-resource"}).result == {}
    assert client.request("resources/unsubscribe", {"uri": "test://watched-resource"}).result == {}


def test_prompts(client: McpClient) -> None:
    prompts = {p["name"]: p for p in client.request("prompts/list").result["prompts"]}
    assert {"test_simple_prompt", "test_prompt_with_arguments", "test_prompt_with_embedded_resource",
            "test_prompt_with_image"} <= set(prompts)
    assert all(p["description"] for p in prompts.values())
    assert prompts["test_simple_prompt"]["description"] == "A simple prompt without arguments"
    assert [(a["name"], a["required"]) for a in prompts["test_prompt_with_arguments"]["arguments"]] == [
        ("arg1", True), ("arg2", True)]
    assert [(a["name"], a["required"]) for a in prompts["test_prompt_with_embedded_resource"]["arguments"]] == [
        ("resourceUri", True)]

    assert client.request("prompts/get", {"name": "test_simple_prompt"}).result["messages"] == [
        {"role": "user", "content": {"type": "text", "text": "This is a simple prompt for testing."}}]
    got = client.request("prompts/get", {"name": "test_prompt_with_arguments",
                                         "arguments": {"arg1": "testValue1", "arg2": "testValue2"}}).result
    assert got["messages"] == [{"role": "user", "content": {
        "type": "text", "text": "Prompt with arguments: arg1='testValue1', arg2='testValue2'"}}]
    got = client.request("prompts/get", {"name": "test_prompt_with_embedded_resource",
                                         "arguments": {"resourceUri": "test://example-resource"}}).result
    assert got["messages"] == [
        {"role": "user", "content": {"type": "resource", "resource": {
            "uri": "test://example-resource", "mimeType": "text/plain",
            "text": "Embedded resource content for testing."}}},
        {"role": "user", "content": {"type": "text", "text": "Please process the embedded resource above."}},
    ]
    got = client.request("prompts/get", {"name": "test_prompt_with_image"}).result
    assert got["messages"] == [
        {"role": "user", "content": {"type": "image", "data": PNG, "mimeType": "image/png"}},
        {"role": "user", "content": {"type": "text", "text": "Please analyze the image above."}},
    ]


def test_completion_of_prompt_argument(client: McpClient) -> None:
    got = client.request("completion/complete", {"ref": {"type": "ref/prompt", "name": "test_prompt_with_arguments"},
                                                 "argument": {"name": "arg1", "value": "test"}}).result
    assert isinstance(got["completion"]["values"], list)
    assert got["completion"]["values"] == ["test", "testing", "tested"]
    assert got["completion"]["total"] == 3 and got["completion"]["hasMore"] is False


def test_logging_set_level_is_empty_result(client: McpClient) -> None:
    assert client.request("logging/setLevel", {"level": "info"}, rid=77).message == {"jsonrpc": "2.0", "id": 77,
                                                                                     "result": {}}


def test_ping_is_empty_result(client: McpClient) -> None:
    assert client.request("ping").result == {}
