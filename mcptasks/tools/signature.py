"""A tool's input and output schemas, derived from its function's signature and annotations."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, get_args, get_type_hints

from pydantic import BaseModel, ConfigDict, create_model

from mcptasks.tools.context import SyncToolContext, ToolContext


class _ArgsBase(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _is_context(annotation: Any) -> bool:
    """Whether a parameter annotation names the tool context (also through Optional/unions)."""
    if annotation in (ToolContext, SyncToolContext):
        return True
    return any(arg in (ToolContext, SyncToolContext) for arg in get_args(annotation))


def return_model(fn: Callable[..., Any]) -> type[BaseModel] | None:
    """The pydantic model a tool's return annotation names, if any (its output schema)."""
    try:
        annotation = get_type_hints(fn).get("return")
    except Exception:  # unresolvable forward references: no derived schema
        return None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def schema_from_signature(
    fn: Callable[..., Any],
) -> tuple[type[BaseModel] | None, dict[str, Any], str | None]:
    """The arguments model, the input schema and the context parameter's name (if any) of ``fn``."""
    sig = inspect.signature(fn)
    # include_extras: keep `Annotated[..., Field(...)]` constraints (bounds, lengths) of the arguments.
    hints = get_type_hints(fn, include_extras=True)
    fields: dict[str, Any] = {}
    ctx_param = None
    for name, param in sig.parameters.items():
        annotation = hints.get(name, Any)
        if _is_context(annotation) or name == "ctx":
            ctx_param = name
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[name] = (annotation, default)
    model = create_model(f"{fn.__name__}_arguments", __base__=_ArgsBase, **fields)
    schema = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    schema.setdefault("properties", {})
    schema["type"] = "object"
    return model, schema, ctx_param
