"""The Dispatcher: routing, parameter validation and error mapping."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pydantic import BaseModel, StrictInt

from mcptasks.protocol.dispatch import Dispatcher
from mcptasks.protocol.errors import INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND, McpError


class AddParams(BaseModel):
    a: StrictInt
    b: StrictInt = 0


def make() -> Dispatcher[dict[str, Any]]:
    d: Dispatcher[dict[str, Any]] = Dispatcher()

    @d.register("add", AddParams)
    async def add(ctx: dict[str, Any], params: AddParams) -> dict[str, Any]:
        ctx["called"] = True
        return {"sum": params.a + params.b}

    @d.register("boom", AddParams, before_init=True)
    async def boom(ctx: dict[str, Any], params: AddParams) -> dict[str, Any]:
        raise RuntimeError("very secret internal detail")

    @d.register("refuse", AddParams)
    async def refuse(ctx: dict[str, Any], params: AddParams) -> dict[str, Any]:
        raise McpError(-32002, "Resource not found", {"uri": "x"})

    return d


async def test_dispatches_with_validated_params() -> None:
    ctx: dict[str, Any] = {}
    assert await make().dispatch(ctx, "add", {"a": 2, "b": 3}) == {"sum": 5}
    assert ctx["called"] is True
    assert await make().dispatch({}, "add", {"a": 2}) == {"sum": 2}


async def test_unknown_method() -> None:
    with pytest.raises(McpError) as exc:
        await make().dispatch({}, "nope/nothing", {})
    assert exc.value.code == METHOD_NOT_FOUND == -32601
    assert "nope/nothing" in exc.value.message


@pytest.mark.parametrize("params", [None, {}, {"a": "1"}, {"a": 1, "b": 1.5}, {"b": 2}])
async def test_bad_params_carry_data(params: Any) -> None:
    ctx: dict[str, Any] = {}
    with pytest.raises(McpError) as exc:
        await make().dispatch(ctx, "add", params)
    assert exc.value.code == INVALID_PARAMS == -32602
    assert isinstance(exc.value.data, list) and exc.value.data
    assert all(set(item) == {"loc", "msg"} for item in exc.value.data)
    assert "called" not in ctx


async def test_crashing_handler_is_internal_error_without_details(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="mcptasks.protocol.dispatch"):
        with pytest.raises(McpError) as exc:
            await make().dispatch({}, "boom", {"a": 1})
    assert exc.value.code == INTERNAL_ERROR == -32603
    assert exc.value.message == "Internal error" and exc.value.data is None
    assert "secret" not in str(exc.value.to_error())
    # No chained exception leaks through __cause__/__context__ display either.
    assert exc.value.__cause__ is None and exc.value.__suppress_context__
    # ...but the traceback is logged server-side.
    assert any(r.exc_info and "very secret internal detail" in str(r.exc_info[1]) for r in caplog.records)


async def test_mcp_errors_pass_through() -> None:
    with pytest.raises(McpError) as exc:
        await make().dispatch({}, "refuse", {"a": 1})
    assert (exc.value.code, exc.value.data) == (-32002, {"uri": "x"})


def test_routes_and_registration() -> None:
    d = make()
    assert d.methods == ["add", "boom", "refuse"]
    route = d.route("boom")
    assert route is not None and route.before_init and route.params is AddParams
    assert d.route("missing") is None
    assert d.route("add") is not None and not d.route("add").before_init  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="twice"):
        d.register("add", AddParams)(lambda ctx, p: None)  # type: ignore[arg-type, return-value]


def test_parse_params_without_running() -> None:
    route, model = make().parse_params("add", {"a": 1})
    assert route.method == "add" and isinstance(model, AddParams) and model.a == 1

