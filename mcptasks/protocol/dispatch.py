"""A dispatch table from JSON-RPC method to handler.

Handlers are ``async def handler(ctx, params) -> dict``; ``params`` is the validated pydantic
model registered with the method. ``ctx`` is whatever the transport passes (opaque here).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from mcptasks.protocol.errors import INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND, McpError
from mcptasks.protocol.jsonrpc import validation_details

logger = logging.getLogger(__name__)

CtxT = TypeVar("CtxT")
Handler = Callable[[Any, Any], Awaitable[Any]]
#: A route's own admission rule: (scope, rate class) decided from the request's context and raw
#: params, or None for what the route declares.
Rules = Callable[[Any, Any], tuple[str | None, str] | None]


@dataclass(frozen=True)
class Route:
    """One method: its parameter model, its handler, and the rules the transport applies.

    ``scope`` is the OAuth scope the method needs (None: any valid token) and ``rate`` its
    rate-limit class; a task-augmented request (params with ``task``) uses ``task_scope`` and
    ``task_rate`` when they are set. ``before_init`` methods may be called without a session.
    ``poll``: a request of this method polls the task its ``params.taskId`` names (a poll sooner
    than the task's poll interval costs an extra read). ``rules``: where scope and rate depend on
    more than the params (the server's own decision, e.g. whether a call creates a task), the
    route's function deciding them (see :meth:`admission_rules`).
    """

    method: str
    params: type[BaseModel]
    handler: Handler
    before_init: bool = False
    scope: str | None = None
    rate: str = "other"
    task_scope: str | None = None
    task_rate: str | None = None
    poll: bool = False
    rules: Rules | None = None

    def scope_for(self, params: Any) -> str | None:
        """The scope this request needs."""
        if self.task_scope is not None and isinstance(params, dict) and "task" in params:
            return self.task_scope
        return self.scope

    def rate_for(self, params: Any) -> str:
        """The rate-limit class this request counts against."""
        if self.task_rate is not None and isinstance(params, dict) and "task" in params:
            return self.task_rate
        return self.rate

    def admission_rules(self, ctx: Any, params: Any) -> tuple[str | None, str]:
        """(scope, rate class) of this request: the route's ``rules`` if it has them and they
        decide, else the declared ones."""
        if self.rules is not None:
            decided = self.rules(ctx, params)
            if decided is not None:
                return decided
        return self.scope_for(params), self.rate_for(params)


class Dispatcher(Generic[CtxT]):
    """Maps method names to handlers and turns every failure into an :class:`McpError`."""

    def __init__(self) -> None:
        self._routes: dict[str, Route] = {}

    def register(
        self,
        method: str,
        params: type[BaseModel],
        *,
        before_init: bool = False,
        scope: str | None = None,
        rate: str = "other",
        task_scope: str | None = None,
        task_rate: str | None = None,
        poll: bool = False,
        rules: Rules | None = None,
    ) -> Callable[[Handler], Handler]:
        """Decorator: register ``handler`` for ``method`` with its rules (see :class:`Route`)."""

        def deco(handler: Handler) -> Handler:
            if method in self._routes:
                raise ValueError(f"method {method!r} registered twice")
            self._routes[method] = Route(
                method, params, handler, before_init=before_init, scope=scope, rate=rate,
                task_scope=task_scope, task_rate=task_rate, poll=poll, rules=rules,
            )
            return handler

        return deco

    def route(self, method: str) -> Route | None:
        """The route for ``method`` or None."""
        return self._routes.get(method)

    @property
    def methods(self) -> list[str]:
        """All registered method names, sorted."""
        return sorted(self._routes)

    def parse_params(self, method: str, params: dict[str, Any] | None) -> tuple[Route, BaseModel]:
        """Find the route and validate its params (-32601 / -32602 on failure)."""
        route = self._routes.get(method)
        if route is None:
            raise McpError(METHOD_NOT_FOUND, f"Method not found: {method}")
        try:
            model = route.params.model_validate(params or {})
        except ValidationError as exc:
            raise McpError(INVALID_PARAMS, f"Invalid params for {method}", validation_details(exc)) from None
        return route, model

    async def dispatch(self, ctx: CtxT, method: str, params: dict[str, Any] | None, *,
                       passthrough: tuple[type[Exception], ...] = ()) -> Any:
        """Run the handler for ``method``; any non-McpError exception becomes -32603.

        ``passthrough``: exceptions the caller (the transport) answers itself, e.g. "database
        unavailable" (503, retry); the method tables do not know the transport's error table.
        Returns the handler's result: a result dict, or whatever deferred-reply object the
        transport and the handler agree on (``StreamReply`` here).
        """
        route, model = self.parse_params(method, params)
        try:
            return await route.handler(ctx, model)
        except McpError:
            raise
        except Exception as exc:
            if isinstance(exc, passthrough):
                raise
            # Logged with the traceback here; the peer only learns that it failed.
            logger.exception("handler for %s crashed", method)
            raise McpError(INTERNAL_ERROR, "Internal error") from None
