"""Fixtures the 2026-07-28 scenarios of @modelcontextprotocol/conformance 0.2.0-alpha.12 name.

Imported by :mod:`mcptasks.conformance.tools` (the module the registry discovers). The
InputRequiredResult fixtures are ordinary tools that call ``ctx.elicit``/``ctx.sample``/
``ctx.list_roots`` with the ``key`` the scenario expects: the 2026-07-28 adapter turns the
pending requests into ``inputRequests`` rounds, a 2025-11-25 client gets them as requests.
"""

from __future__ import annotations

import asyncio
from typing import Any

from mcptasks.methods import inputs
from mcptasks.tools.registry import ToolContext, ToolResult, prompt, text, tool

NAME_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def _content(answer: dict[str, Any], field: str) -> Any:
    content = answer.get("content")
    return content.get(field) if isinstance(content, dict) else None


def _sampled_text(answer: dict[str, Any]) -> str:
    content = answer.get("content")
    if isinstance(content, dict):
        return str(content.get("text", ""))
    if isinstance(content, list) and content and isinstance(content[0], dict):
        return str(content[0].get("text", ""))
    return ""


# --- tasks extension (SEP-2663) ---------------------------------------------------------------


@tool(description="Greets someone (never a task)")
async def greet(name: str) -> str:
    return f"Hello, {name}!"


@tool(description="Sleeps for `seconds`, then answers; runs as a task when the client takes one",
      task_support="optional")
async def slow_compute(ctx: ToolContext, seconds: float = 1.0, label: str = "") -> str:
    remaining = max(0.0, min(float(seconds), 300.0))
    while remaining > 0:
        ctx.check_cancelled()
        step = min(0.1, remaining)
        await asyncio.sleep(step)
        remaining -= step
    return f"Computed {label[:100]} after {seconds:g}s".replace("  ", " ")


@tool(description="Always reports a tool error after about a second (task only)", task_support="required")
async def failing_job() -> ToolResult:
    await asyncio.sleep(1.0)
    return ToolResult(content=[text("The job failed on purpose")], is_error=True)


@tool(description="Fails with a protocol error (task-capable)", task_support="optional")
async def protocol_error_job() -> str:
    raise RuntimeError("protocol_error_job failed on purpose")


@tool(description="Asks for confirmation before deleting a file (task-capable)", task_support="optional")
async def confirm_delete(filename: str, ctx: ToolContext) -> str:
    answer = await ctx.elicit(
        f"Delete {filename}?",
        {"type": "object", "properties": {"confirm": {"type": "boolean"}}, "required": ["confirm"]},
    )
    if answer.get("action") == "accept" and _content(answer, "confirm") is True:
        return f"Deleted {filename}"
    return f"Kept {filename}"


@tool(description="Asks two questions at once (task-capable)", task_support="optional")
async def multi_input(ctx: ToolContext) -> str:
    first, second = await asyncio.gather(
        ctx.elicit("First question: your name?", NAME_SCHEMA),
        ctx.elicit("Second question: your name again?", NAME_SCHEMA),
    )
    return f"Answers: {_content(first, 'name')}, {_content(second, 'name')}"


@tool(description="Gathers a name, then runs as a task (task only)", task_support="required",
      meta={"io.mcptasks/gatherInputFirst": True})
async def test_tool_with_task(ctx: ToolContext) -> str:
    answer = await ctx.elicit("What is your name?", NAME_SCHEMA, key="user_name")
    return f"Hello, {_content(answer, 'name')}!"


# --- core (SEP-2575, SEP-2322) ----------------------------------------------------------------


@tool(description="Needs the sampling capability")
async def test_missing_capability(ctx: ToolContext) -> str:
    answer = await ctx.sample("Say hello", max_tokens=20)
    return _sampled_text(answer)


@tool(description="Asks the user something while the call is in flight")
async def test_streaming_elicitation(ctx: ToolContext) -> str:
    answer = await ctx.elicit("What is your name?", NAME_SCHEMA, key="user_name")
    return f"Hello, {_content(answer, 'name')}!"


@tool(description="Logs while it runs")
async def test_logging_tool(ctx: ToolContext) -> str:
    await ctx.log("info", "test_logging_tool ran")
    return "Logged"


@tool(description="One elicitation round (SEP-2322)")
async def test_input_required_result_elicitation(ctx: ToolContext) -> str:
    answer = await ctx.elicit("What is your name?", NAME_SCHEMA, key="user_name")
    return f"Hello, {_content(answer, 'name')}!"


@tool(description="One sampling round (SEP-2322)")
async def test_input_required_result_sampling(ctx: ToolContext) -> str:
    answer = await ctx.sample("What is the capital of France?", max_tokens=100, key="capital_question")
    return _sampled_text(answer)


@tool(description="One roots/list round (SEP-2322)")
async def test_input_required_result_list_roots(ctx: ToolContext) -> str:
    answer = await ctx.list_roots(key="client_roots")
    roots = answer.get("roots")
    uris = [str(r.get("uri")) for r in roots if isinstance(r, dict)] if isinstance(roots, list) else []
    return f"Roots: {', '.join(uris) if uris else '(none)'}"


@tool(description="A round whose requestState is verified (SEP-2322)")
async def test_input_required_result_request_state(ctx: ToolContext) -> str:
    answer = await ctx.elicit(
        "Please confirm", {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
        key="confirm",
    )
    # Reaching this line means the adapter verified the signed requestState of the retry.
    return f"state-ok: confirmed={_content(answer, 'ok')}"


@tool(description="Three input requests in one round (SEP-2322)")
async def test_input_required_result_multiple_inputs(ctx: ToolContext) -> str:
    name, greeting, roots = await asyncio.gather(
        ctx.elicit("What is your name?", NAME_SCHEMA, key="user_name"),
        ctx.sample("Generate a greeting", max_tokens=50, key="greeting"),
        ctx.list_roots(key="client_roots"),
    )
    count = len(roots.get("roots") or []) if isinstance(roots.get("roots"), list) else 0
    return f"{_sampled_text(greeting)} {_content(name, 'name')} ({count} roots)"


@tool(description="Two rounds, one question each (SEP-2322)")
async def test_input_required_result_multi_round(ctx: ToolContext) -> str:
    name = await ctx.elicit("Step 1: What is your name?", NAME_SCHEMA, key="step1")
    color = await ctx.elicit(
        "Step 2: What is your favorite color?",
        {"type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"]}, key="step2",
    )
    return f"{_content(name, 'name')} likes {_content(color, 'color')}"


@tool(description="A round whose requestState the client tampers with (SEP-2322)")
async def test_input_required_result_tampered_state(ctx: ToolContext) -> str:
    answer = await ctx.elicit("What is your name?", NAME_SCHEMA, key="user_name")
    return f"Hello, {_content(answer, 'name')}!"


@tool(description="Asks only for what the client declared (SEP-2322)")
async def test_input_required_result_capabilities(ctx: ToolContext) -> str:
    asks = []
    if ctx.client_supports("elicitation"):
        asks.append(ctx.elicit("What is your name?", NAME_SCHEMA, key="user_name"))
    if ctx.client_supports("sampling"):
        asks.append(ctx.sample("Generate a greeting", max_tokens=50, key="greeting"))
    answers = await asyncio.gather(*asks)
    return f"Answered {len(answers)} request(s)"


@tool(
    description="Echoes a region that also travels in the Mcp-Param-Region header (SEP-2243)",
    input_schema={"type": "object", "properties": {
        "region": {"type": "string", "x-mcp-header": "Region"},
        "query": {"type": "string"},
    }, "required": ["region"]},
)
async def test_custom_header(region: str, query: str = "") -> str:
    return f"region={region}"


@prompt(description="A prompt that asks the user for context first (SEP-2322)", arguments=[])
def test_input_required_result_prompt() -> list[dict[str, Any]]:
    answers = inputs.require({"user_context": {"method": "elicitation/create", "params": {
        "message": "What context should the prompt use?",
        "requestedSchema": {"type": "object", "properties": {"context": {"type": "string"}},
                            "required": ["context"]},
    }}})
    context = _content(answers["user_context"], "context") or "(none)"
    return [{"role": "user", "content": {"type": "text", "text": f"Use this context: {context}"}}]
