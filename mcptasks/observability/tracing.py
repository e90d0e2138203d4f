"""Traces (OpenTelemetry), for every process role.

**Traces** are off unless ``OTEL_TRACES_EXPORTER`` names an exporter (``console``, ``otlp``, or
any ``opentelemetry_traces_exporter`` entry point); the other standard ``OTEL_*`` variables
(service name, resource attributes, sampler, OTLP endpoint, batch delays, attribute limits) apply
as the SDK reads them. :func:`setup_tracing` runs once per process (``McpTasksConfig.ready``): web
processes under daphne or granian, ``mcptasks_worker`` and ``serve`` alike. It installs the
standard Django, psycopg and Redis instrumentations; ``asgi.py`` wraps the MCP endpoint in the
ASGI instrumentation (which continues an incoming W3C ``traceparent`` header). Off, every helper
here costs one flag check.

A task stores the ``traceparent`` of the span that created it (``Task.traceparent``), so the
worker's claim, run and outcome spans and a later ``tasks/result`` join the creating request's
trace, in whatever process they run. Span attributes name the tenant, the principal (a keyed
hash, never its name or a token), the tool and the task id.

Log lines (:mod:`mcptasks.observability.logs`) carry the trace id of the current span once
:func:`setup_tracing` has turned traces on.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from mcptasks.observability import logs
from mcptasks.observability.logs import bind_log, clip

logger = logging.getLogger(__name__)

#: Set once by :func:`setup_tracing`; everything below checks it first.
TRACING = False
_tracer: Any = None

#: A W3C traceparent (version 00): what a client may hand us, checked before it is parsed.
_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
#: Span attribute values past this length are cut (unless ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT``
#: says otherwise): a client-chosen string never makes a span unbounded.
DEFAULT_ATTRIBUTE_LIMIT = 256
_SPAN_NAMES = 64


# --- tracing setup ------------------------------------------------------------------------------


def tracing_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for traces (``OTEL_TRACES_EXPORTER`` set, not ``none``)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    return bool(names) and names != ["none"]


def _exporter(name: str) -> tuple[Any, bool]:
    """The exporter called ``name`` and whether it exports at once (console) or in batches."""
    from importlib.metadata import entry_points

    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        # One compact JSON object per line (the default is indented over many lines), to stdout:
        # the process log, where a developer (or a test) reads it.
        return ConsoleSpanExporter(out=sys.stdout, formatter=lambda span: span.to_json(indent=None) + "\n"), True
    if name == "otlp":
        protocol = (
            os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "http/protobuf"
        ).strip()
        name = "otlp_proto_grpc" if protocol == "grpc" else "otlp_proto_http"
    found = entry_points(group="opentelemetry_traces_exporter", name=name)
    if not found:
        raise RuntimeError(
            f"OTEL_TRACES_EXPORTER names {name!r}, which no installed package provides "
            "(install the `otel` extra for otlp)"
        )
    return next(iter(found)).load()(), False


def setup_tracing(role: str) -> bool:
    """Install the tracer provider, exporters and instrumentations when ``OTEL_*`` asks for them.

    Idempotent; returns whether tracing is on. ``role`` becomes the ``mcptasks.role`` resource
    attribute (``web``, ``worker``, ``serve``, ``manage``).
    """
    global TRACING, _tracer
    if TRACING or not tracing_requested():
        return TRACING
    from opentelemetry import trace
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    limit = os.environ.get("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT") or os.environ.get(
        "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT"
    )
    # service.name: OTEL_SERVICE_NAME, else this default; OTEL_RESOURCE_ATTRIBUTES are merged in.
    resource = Resource.create(
        {"service.name": os.environ.get("OTEL_SERVICE_NAME") or "mcptasks", "mcptasks.role": role}
    )
    provider = TracerProvider(
        resource=resource, span_limits=SpanLimits(max_attribute_length=None if limit else DEFAULT_ATTRIBUTE_LIMIT)
    )
    for name in os.environ.get("OTEL_TRACES_EXPORTER", "").split(","):
        name = name.strip().lower()
        if not name or name == "none":
            continue
        exporter, immediate = _exporter(name)
        provider.add_span_processor(SimpleSpanProcessor(exporter) if immediate else BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    DjangoInstrumentor().instrument()
    PsycopgInstrumentor().instrument()
    RedisInstrumentor().instrument()
    _tracer = trace.get_tracer("mcptasks")
    logs.current_trace_id = _current_trace_id
    TRACING = True
    logger.info("OpenTelemetry traces on (%s, role %s)", os.environ.get("OTEL_TRACES_EXPORTER"), role)
    return True


def wrap_asgi(app: Any) -> Any:
    """The MCP endpoint's ASGI app in the ASGI instrumentation when tracing is on (else ``app``).

    It opens the request's server span and continues an incoming ``traceparent`` header; the
    per-message send/receive spans (one per SSE event) are left out.
    """
    if not TRACING:
        return app
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

    return OpenTelemetryMiddleware(app, exclude_spans=["receive", "send"])


# --- spans -----------------------------------------------------------------------------------


def principal_hash(principal: Any) -> str:
    """A stable, keyed hash of a principal (16 hex digits): joins one caller's spans, names nobody."""
    from django.conf import settings

    key = hashlib.sha256(b"mcptasks-trace-principal:" + settings.SECRET_KEY.encode()).digest()
    return hmac.new(key, str(principal).encode(), hashlib.sha256).hexdigest()[:16]


def valid_traceparent(value: Any) -> str | None:
    """``value`` if it is a well-formed W3C traceparent with non-zero ids, else None."""
    if not isinstance(value, str) or len(value) != 55:
        return None
    m = _TRACEPARENT.match(value)
    if m is None or set(m.group(1)) == {"0"} or set(m.group(2)) == {"0"}:
        return None
    return value


def _context_of(traceparent: str | None) -> Any:
    """The OpenTelemetry context a stored or client-given traceparent names (None if none)."""
    if not traceparent or valid_traceparent(traceparent) is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({"traceparent": traceparent})


def current_traceparent() -> str:
    """The traceparent of the current span (stored with a new task); empty when tracing is off."""
    if not TRACING:
        return ""
    from opentelemetry import trace

    sc = trace.get_current_span().get_span_context()
    if not sc.is_valid:
        return ""
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"


def _current_trace_id() -> str | None:
    """The trace id of the current span, for log lines (tracing is on when this is installed)."""
    from opentelemetry import trace

    sc = trace.get_current_span().get_span_context()
    return f"{sc.trace_id:032x}" if sc.is_valid else None


def _trace_id_of(traceparent: str | None) -> str | None:
    return traceparent[3:35] if traceparent and valid_traceparent(traceparent) else None


def _auth_attributes(auth: Any) -> dict[str, Any]:
    if auth is None:
        return {}
    return {
        "mcptasks.tenant": str(getattr(auth, "tenant_slug", "") or auth.tenant_id),
        "mcptasks.principal": principal_hash(auth.principal_id),
    }


#: What the span helpers return with tracing off: one shared no-op context manager, no allocation.
_OFF: contextlib.AbstractContextManager[Any] = contextlib.nullcontext(None)


def rpc_span(method: str, params: Any, *, auth: Any, known: bool) -> contextlib.AbstractContextManager[Any]:
    """The span of one JSON-RPC request (None when tracing is off).

    A ``params._meta.traceparent`` continues the client's trace (as the ``traceparent`` header
    does for the whole HTTP request). ``known``: whether the method is one we serve; only those
    name the span (a client's method string never becomes a span name).
    """
    return _rpc_span(method, params, auth=auth, known=known) if TRACING else _OFF


@contextlib.contextmanager
def _rpc_span(method: str, params: Any, *, auth: Any, known: bool) -> Iterator[Any]:
    from opentelemetry import trace

    meta = params.get("_meta") if isinstance(params, dict) else None
    parent = _context_of(meta.get("traceparent")) if isinstance(meta, dict) else None
    attrs: dict[str, Any] = {
        "rpc.system": "jsonrpc", "rpc.method": method if known else clip(method, _SPAN_NAMES), **_auth_attributes(auth)
    }
    if isinstance(params, dict):
        if method == "tools/call" and isinstance(params.get("name"), str):
            attrs["mcptasks.tool"] = params["name"]
        if isinstance(params.get("taskId"), str):
            attrs["mcptasks.task_id"] = params["taskId"]
    name = f"mcp {method}" if known else "mcp (unknown method)"
    with _tracer.start_as_current_span(name[:_SPAN_NAMES], context=parent, kind=trace.SpanKind.SERVER,
                                       attributes=attrs, set_status_on_exception=False) as span:
        try:
            yield span
        except BaseException as exc:
            _failed(span, exc)
            raise


def _failed(span: Any, exc: BaseException) -> None:
    """Mark ``span`` failed with a bounded description (the SDK's own is the whole message, which
    may repeat a client's string; the attribute limits do not apply to it)."""
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, clip(f"{type(exc).__name__}: {exc}", 200)))


def note_task(span: Any, result: Any) -> None:
    """Name the task a request created or streams (its handler's ``result``) on its span and log lines."""
    if not (TRACING or logs.JSON_LOGS):
        return
    task = getattr(result, "task", None)
    if task is not None:
        task_id = task.task_id
    elif isinstance(result, dict) and isinstance(result.get("task"), dict):
        task_id = result["task"].get("taskId")
    elif isinstance(result, dict) and result.get("resultType") == "task":
        task_id = result.get("taskId")  # MCP 2026-07-28: the task is the result
    else:
        return
    if logs.JSON_LOGS:
        bind_log(task_id=task_id)
    if span is not None and isinstance(task_id, str):
        span.set_attribute("mcptasks.task_id", task_id)


def _task_attributes(task: Any) -> dict[str, Any]:
    return {
        "mcptasks.task_id": task.task_id,
        "mcptasks.tool": task.tool_name,
        "mcptasks.tenant": str(getattr(task, "tenant_slug", None) or task.tenant_id),
        "mcptasks.principal": principal_hash(task.principal_id),
        "mcptasks.task_kind": task.kind,
    }


def task_span(
    task: Any, name: str, *, link_current: bool = False, **attributes: Any
) -> contextlib.AbstractContextManager[Any]:
    """A span in the task's own trace (the creating request's, from ``Task.traceparent``).

    ``link_current``: also link the span the caller is in (a ``tasks/result`` request with its
    own trace). None (and no work) when tracing is off.
    """
    return _task_span(task, name, link_current=link_current, **attributes) if TRACING else _OFF


@contextlib.contextmanager
def _task_span(task: Any, name: str, *, link_current: bool, **attributes: Any) -> Iterator[Any]:
    from opentelemetry import trace

    links = []
    if link_current:
        sc = trace.get_current_span().get_span_context()
        if sc.is_valid:
            links.append(trace.Link(sc))
    parent = _context_of(task.traceparent)
    if parent is None:
        from opentelemetry.context import Context

        # No stored context (created while tracing was off): a trace of its own, never a child of
        # whatever is current (an embedded worker inherits the context of the request that started it).
        parent = Context()
    with _tracer.start_as_current_span(
        name, context=parent, links=links, attributes={**_task_attributes(task), **attributes}
    ) as span:
        yield span


def task_run(task: Any, *, worker_id: str) -> contextlib.AbstractContextManager[Any]:
    """Around a worker's run of ``task``: its log context, and the claim and run spans."""
    return _task_run(task, worker_id=worker_id) if TRACING or logs.JSON_LOGS else _OFF


@contextlib.contextmanager
def _task_run(task: Any, *, worker_id: str) -> Iterator[None]:
    token = logs.log_context.set({
        "tenant": str(getattr(task, "tenant_slug", None) or task.tenant_id),
        "task_id": task.task_id,
        "trace_id": _trace_id_of(task.traceparent),
    })
    try:
        if not TRACING:
            yield
            return
        attrs = {"mcptasks.worker_id": worker_id, "mcptasks.attempt": task.attempt}
        with task_span(task, "mcptasks.task.claim", **attrs):
            pass  # the claim happened just now; this marks it (and which worker) in the trace
        with task_span(task, f"mcptasks.task.run {task.tool_name}"[:_SPAN_NAMES], **attrs):
            yield
    finally:
        logs.log_context.reset(token)


def span(name: str, *, task: Any = None, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """A child span of the current one, with ``task``'s attributes if given (None when tracing is off)."""
    return _span(name, task=task, **attributes) if TRACING else _OFF


@contextlib.contextmanager
def _span(name: str, *, task: Any, **attributes: Any) -> Iterator[Any]:
    if task is not None:
        attributes = {**_task_attributes(task), **attributes}
    with _tracer.start_as_current_span(name, attributes=attributes) as s:
        yield s
