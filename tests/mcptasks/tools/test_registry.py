"""The tool-author API: schemas, invocation and result conversion (no database)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel, Field

from mcptasks.tools.context import SyncToolContext, ToolContext
from mcptasks.tools.registry import Registry, ToolInputError, ToolResult, audio, image, text, to_call_tool_result


class Out(BaseModel):
    """An output model (module level: type hints are resolved from the module's globals)."""

    total: int


class FakeBackend:
    """A ContextBackend that records what tools send."""

    def __init__(self) -> None:
        self.cancelled = False
        self.progress_calls: list[tuple[float, float | None, str | None]] = []
        self.logs: list[tuple[str, Any]] = []
        self.requests: list[tuple[str, dict[str, Any]]] = []

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        self.progress_calls.append((progress, total, message))

    async def log(self, level: str, data: Any, logger: str | None) -> None:
        self.logs.append((level, data))

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.requests.append((method, params))
        return {"action": "accept", "content": {"answer": "42"}}

    async def set_status_message(self, message: str) -> None:
        pass

    def client_supports(self, capability: str) -> bool:
        return True


def ctx() -> tuple[ToolContext, FakeBackend]:
    backend = FakeBackend()
    return ToolContext(backend, request_id=1), backend


# --- schemas ----------------------------------------------------------------------------------


def test_schema_from_signature() -> None:
    reg = Registry()

    @reg.tool(description="Adds.")
    async def add(a: int, b: float = 1.5, label: str | None = None, tags: list[str] | None = None,
                  ctx: ToolContext | None = None) -> str:
        return "x"

    schema = reg.tools["add"].input_schema
    assert schema["type"] == "object"
    assert schema["required"] == ["a"]
    assert set(schema["properties"]) == {"a", "b", "label", "tags"}  # ctx excluded
    assert schema["properties"]["a"] == {"type": "integer"}
    assert schema["properties"]["b"]["type"] == "number" and schema["properties"]["b"]["default"] == 1.5
    assert schema["properties"]["label"]["default"] is None
    assert schema["additionalProperties"] is False
    assert "title" not in schema and all("title" not in p for p in schema["properties"].values())
    Draft202012Validator.check_schema(schema)
    assert reg.tools["add"].ctx_param == "ctx"


def test_ctx_detected_by_annotation_or_name_and_no_args() -> None:
    reg = Registry()

    @reg.tool()
    async def by_type(x: int, context: ToolContext) -> str:
        """Doc used as description."""
        return "x"

    @reg.tool()
    def by_name(ctx: Any) -> str:
        return "x"

    @reg.tool()
    async def nothing() -> str:
        return "x"

    assert reg.tools["by_type"].ctx_param == "context"
    assert reg.tools["by_type"].description == "Doc used as description."
    assert list(reg.tools["by_type"].input_schema["properties"]) == ["x"]
    assert reg.tools["by_name"].ctx_param == "ctx"
    assert reg.tools["by_name"].input_schema["properties"] == {}
    assert reg.tools["nothing"].input_schema == {"type": "object", "properties": {}, "additionalProperties": False}


def test_input_model_and_explicit_schema() -> None:
    reg = Registry()

    class Args(BaseModel):
        """Search arguments."""

        query: str = Field(min_length=1)
        limit: int = 10

    @reg.tool(input_model=Args, description="Search")
    async def search(query: str, limit: int) -> str:
        return f"{query}:{limit}"

    schema = reg.tools["search"].input_schema
    assert schema["type"] == "object" and schema["required"] == ["query"]
    assert schema["properties"]["limit"]["default"] == 10
    assert reg.tools["search"].validate_arguments({"query": "q"}) == {"query": "q", "limit": 10}
    with pytest.raises(ToolInputError):
        reg.tools["search"].validate_arguments({"query": ""})

    explicit = {"type": "object", "properties": {"n": {"type": "string"}}, "additionalProperties": False}

    @reg.tool(input_schema=explicit, description="Raw")
    async def raw(**arguments: Any) -> str:
        return "raw"

    assert reg.tools["raw"].input_schema == explicit
    # No model: arguments are passed through unvalidated.
    assert reg.tools["raw"].validate_arguments({"anything": 1}) == {"anything": 1}
    assert reg.tools["raw"].validate_arguments(None) == {}


def test_definition_fields_and_execution() -> None:
    reg = Registry()

    @reg.tool(title="Sum", description="Sums", annotations={"readOnlyHint": True}, output_schema=Out,
              task_support="optional", meta={"k": "v"})
    async def summer(a: int) -> Out:
        return Out(total=a)

    d = reg.tools["summer"].definition()
    assert d["name"] == "summer" and d["title"] == "Sum" and d["description"] == "Sums"
    assert d["annotations"] == {"readOnlyHint": True} and d["_meta"] == {"k": "v"}
    assert d["execution"] == {"taskSupport": "optional"}
    assert d["outputSchema"]["properties"]["total"]["type"] == "integer"
    assert "execution" not in reg.tools["summer"].definition(with_execution=False)


@pytest.mark.parametrize("name", ["bad name", "", "x" * 129, "slash/name", "ünïcode", "semi;colon"])
def test_invalid_tool_names_are_rejected(name: str) -> None:
    with pytest.raises(ValueError, match="invalid tool name"):
        Registry().tool(name)(lambda: "x")


@pytest.mark.parametrize("name", ["a", "A-b_c.d", "x" * 128, "tool.v2"])
def test_valid_tool_names(name: str) -> None:
    reg = Registry()
    reg.tool(name)(lambda: "x")
    assert reg.get_tool(name) is not None


def test_bad_task_support_rejected() -> None:
    with pytest.raises(ValueError, match="task_support"):
        Registry().tool(task_support="sometimes")  # type: ignore[arg-type]


def test_sorted_tools() -> None:
    reg = Registry()
    for n in ("b", "a", "c"):
        reg.tool(n)(lambda: "x")
    assert [t.name for t in reg.sorted_tools()] == ["a", "b", "c"]


# --- validation -------------------------------------------------------------------------------


def test_validate_arguments_errors() -> None:
    reg = Registry()

    @reg.tool()
    async def typed(n: int, s: str = "d") -> str:
        return "x"

    tool = reg.tools["typed"]
    assert tool.validate_arguments({"n": 3}) == {"n": 3, "s": "d"}
    with pytest.raises(ToolInputError) as exc:
        tool.validate_arguments({})
    assert "Invalid arguments for tool typed" in str(exc.value) and "n:" in str(exc.value)
    with pytest.raises(ToolInputError, match="n:"):
        tool.validate_arguments({"n": "not a number"})
    with pytest.raises(ToolInputError, match="extra"):
        tool.validate_arguments({"n": 1, "extra": True})


# --- invocation -------------------------------------------------------------------------------


async def test_async_tool_gets_context_and_reports() -> None:
    reg = Registry()

    @reg.tool()
    async def talk(x: int, ctx: ToolContext) -> str:
        await ctx.report_progress(1, 2, "half")
        await ctx.info("hello")
        answer = await ctx.elicit("Q?", {"type": "object", "properties": {}})
        return f"{x}:{answer['content']['answer']}"

    c, backend = ctx()
    result = await reg.tools["talk"].invoke({"x": 7}, c)
    assert result == {"content": [{"type": "text", "text": "7:42"}]}
    assert backend.progress_calls == [(1, 2, "half")] and backend.logs == [("info", "hello")]
    assert backend.requests[0][0] == "elicitation/create" and backend.requests[0][1]["mode"] == "form"


async def test_sync_tool_runs_in_a_thread_with_sync_context() -> None:
    reg = Registry()
    seen: dict[str, Any] = {}

    @reg.tool()
    def blocking(x: int, ctx: SyncToolContext) -> str:
        seen["thread"] = threading.current_thread()
        seen["ctx"] = ctx
        ctx.report_progress(1, 1)
        return str(x * 2)

    assert not reg.tools["blocking"].is_async
    c, backend = ctx()
    assert await reg.tools["blocking"].invoke({"x": 4}, c) == {"content": [{"type": "text", "text": "8"}]}
    assert seen["thread"] is not threading.main_thread()
    assert isinstance(seen["ctx"], SyncToolContext)
    assert backend.progress_calls == [(1, 1, None)]


async def test_output_schema_gives_structured_content() -> None:
    reg = Registry()

    @reg.tool(output_schema={"type": "object", "properties": {"total": {"type": "integer"}}})
    async def with_dict(a: int) -> dict[str, Any]:
        return {"total": a}

    @reg.tool(output_schema=Out)
    async def with_model(a: int) -> Out:
        return Out(total=a)

    c, _ = ctx()
    for name in ("with_dict", "with_model"):
        result = await reg.tools[name].invoke({"a": 5}, c)
        assert result["structuredContent"] == {"total": 5}
        assert result["content"] == [{"type": "text", "text": '{"total": 5}'}]


async def test_tool_result_and_is_error() -> None:
    reg = Registry()

    @reg.tool()
    async def failing() -> ToolResult:
        return ToolResult(content=[text("nope")], is_error=True, meta={"m": 1})

    c, _ = ctx()
    assert await reg.tools["failing"].invoke({}, c) == {
        "content": [{"type": "text", "text": "nope"}], "isError": True, "_meta": {"m": 1}}
    assert ToolResult(content=[text("ok")], structured_content={"a": 1}).wire() == {
        "content": [{"type": "text", "text": "ok"}], "structuredContent": {"a": 1}}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("hi", {"content": [{"type": "text", "text": "hi"}]}),
        (None, {"content": []}),
        ({"content": [{"type": "text", "text": "raw"}], "isError": True},
         {"content": [{"type": "text", "text": "raw"}], "isError": True}),
        ({"type": "text", "text": "block"}, {"content": [{"type": "text", "text": "block"}]}),
        ([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
         {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
        (42, {"content": [{"type": "text", "text": "42"}]}),
        ({"k": 1}, {"content": [{"type": "text", "text": '{"k": 1}'}]}),
    ],
)
def test_to_call_tool_result(value: Any, expected: dict[str, Any]) -> None:
    assert to_call_tool_result(value) == expected


def test_content_helpers() -> None:
    assert text("t") == {"type": "text", "text": "t"}
    assert image(b"\x89PNG", "image/png") == {"type": "image", "data": "iVBORw==", "mimeType": "image/png"}
    assert audio("AAAA", "audio/wav") == {"type": "audio", "data": "AAAA", "mimeType": "audio/wav"}


async def test_cancelled_context_raises() -> None:
    from mcptasks.tools.context import ToolCancelled

    c, backend = ctx()
    backend.cancelled = True
    assert c.cancelled
    with pytest.raises(ToolCancelled):
        await c.report_progress(1)
    with pytest.raises(ToolCancelled):
        c.check_cancelled()


def test_server_dispatch_table_is_complete() -> None:
    """The server's dispatch table routes every method the issue lists (imports handlers, no DB use)."""
    from mcptasks.methods.era2025 import dispatcher

    expected = {
        "initialize", "ping", "tools/list", "tools/call", "resources/list", "resources/read",
        "resources/templates/list", "resources/subscribe", "resources/unsubscribe", "prompts/list", "prompts/get",
        "completion/complete", "logging/setLevel", "tasks/get", "tasks/result", "tasks/list", "tasks/cancel",
    }
    assert expected <= set(dispatcher.methods)
    init = dispatcher.route("initialize")
    assert init is not None and init.before_init


def test_bare_tool_decorator_is_a_type_error() -> None:
    """Issue 12: bare ``@tool`` used to register nothing and replace the function silently."""
    from mcptasks.tools.registry import Registry

    reg = Registry()
    with pytest.raises(TypeError):

        @reg.tool  # type: ignore[arg-type]
        async def oops(a: int) -> str:
            return str(a)


def test_optional_context_is_detected_and_kept_out_of_the_schema() -> None:
    from mcptasks.tools.registry import Registry

    reg = Registry()

    @reg.tool()
    async def uses_ctx(a: int, context: ToolContext | None = None) -> str:
        return str(a)

    t = reg.get_tool("uses_ctx")
    assert t is not None and t.ctx_param == "context"
    assert set(t.input_schema["properties"]) == {"a"}
    assert uses_ctx.__name__ == "uses_ctx"  # the function itself is returned


class Report(BaseModel):
    """A tool's output model (module level: annotations are resolved in the module's globals)."""

    rows: int


def test_output_schema_comes_from_a_model_return_annotation() -> None:
    from mcptasks.tools.registry import Registry

    reg = Registry()

    @reg.tool()
    async def build() -> Report:
        return Report(rows=1)

    t = reg.get_tool("build")
    assert t is not None and t.output_schema is not None
    assert t.output_schema["properties"]["rows"]["type"] == "integer"
