"""Units of mcptasks/observability.py: the JSON log line, traceparent checks, the off switch.

The cross-process behaviour (one trace through web and worker, logs of real processes) is
tests/e2e/test_observability.py.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from types import SimpleNamespace

import pytest

from mcptasks import observability
from tests.support.servers import REPO


def _record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("mcptasks.test", logging.WARNING, __file__, 1, msg, args, None)


def test_json_line_redacts_credentials_and_clips_client_strings() -> None:
    token = "s3cr3t-" + "a" * 40
    jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl"
    huge = "Y" * 100_000
    line = observability.JsonFormatter().format(
        _record("auth %s / %s / token=%s / %s", f"Bearer {token}", jwt, token, huge)
    )
    assert "\n" not in line
    entry = json.loads(line)
    assert token not in line and jwt not in line
    assert entry["message"].startswith("auth Bearer [redacted] / [redacted-jwt] / token=[redacted] / ")
    assert len(entry["message"]) <= observability.MESSAGE_MAX_CHARS + 40
    assert entry["message"].endswith("more chars]")
    assert {"request_id", "tenant", "task_id", "trace_id"} <= entry.keys()


def test_json_line_carries_the_bound_context() -> None:
    import contextvars

    def inside() -> dict[str, object]:
        observability.bind_log(request_id="r1", tenant="acme", task_id="t" * 500)
        return json.loads(observability.JsonFormatter().format(_record("hello")))  # type: ignore[no-any-return]

    entry = contextvars.copy_context().run(inside)
    assert entry["request_id"] == "r1" and entry["tenant"] == "acme"
    assert len(entry["task_id"]) < 200  # a bound client string is clipped too
    # Nothing leaks into the caller's context.
    assert json.loads(observability.JsonFormatter().format(_record("x")))["tenant"] is None


def test_task_run_binds_task_and_trace_id_for_its_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(observability.logs, "JSON_LOGS", True)
    task = SimpleNamespace(task_id="abc", tenant_id=7, tenant_slug="acme",
                           traceparent="00-" + "4b" * 16 + "-" + "00f067aa0ba902b7" + "-01")
    with observability.task_run(task, worker_id="w1"):
        entry = json.loads(observability.JsonFormatter().format(_record("in run")))
    assert (entry["task_id"], entry["tenant"], entry["trace_id"]) == ("abc", "acme", "4b" * 16)
    after = json.loads(observability.JsonFormatter().format(_record("after")))
    assert after["task_id"] is None


def test_traceparent_validation() -> None:
    good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert observability.valid_traceparent(good) == good
    for bad in (
        "00-" + "0" * 32 + "-00f067aa0ba902b7-01",  # zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01",  # zero span id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # unknown version
        good.upper(), good + "x", good * 100, 12, None, {"traceparent": good},
    ):
        assert observability.valid_traceparent(bad) is None, bad


def test_tracing_is_off_unless_an_exporter_is_named() -> None:
    assert not observability.tracing_requested({})
    assert not observability.tracing_requested({"OTEL_TRACES_EXPORTER": "none"})
    assert not observability.tracing_requested({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"})
    assert observability.tracing_requested({"OTEL_TRACES_EXPORTER": "console"})
    # Off in this test process: every hook is a no-op.
    assert observability.TRACING is False
    assert observability.current_traceparent() == ""
    with observability.rpc_span("tools/call", {"_meta": {"traceparent": "x"}}, auth=None, known=True) as span:
        assert span is None
    # The hot path's hooks hand back one shared no-op: nothing is built per request.
    task = SimpleNamespace(task_id="t", tenant_id=1, traceparent="")
    assert observability.rpc_span("ping", {}, auth=None, known=True) is observability._OFF
    assert observability.task_span(task, "x") is observability._OFF
    assert observability.span("x") is observability._OFF
    assert observability.task_run(task, worker_id="w") is observability._OFF


@pytest.mark.processes(reason="starts Django in a fresh interpreter")
def test_an_unknown_log_format_is_refused_at_startup() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "import mcptasks.settings"], cwd=REPO, capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "MCPTASKS_LOG_FORMAT": "xml"},
    )
    assert proc.returncode != 0
    assert "MCPTASKS_LOG_FORMAT must be plain or json" in proc.stderr
