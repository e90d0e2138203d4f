"""The stored event stream: numbering survives a cursor that cleanup removed."""

from __future__ import annotations

import pytest

from mcptasks import bus, services
from mcptasks.models import StreamCursor, StreamEvent

pytestmark = pytest.mark.django_db


def test_numbering_continues_after_cleanup_removed_an_orphan_cursor() -> None:
    # Tasks enqueued without a client have a session id with no session row: cleanup treats
    # their stream's cursor as an orphan while the stream's events are still retained.
    stream = bus.get_stream_id("no-such-session")
    for _ in range(3):
        bus.publish(session_id="no-such-session", stream_id=stream, message={"n": 1})
    services.cleanup_expired()
    assert not StreamCursor.objects.filter(pk=stream).exists()
    event_id = bus.publish(session_id="no-such-session", stream_id=stream, message={"n": 2})
    assert event_id == f"{stream}.4"
    assert list(StreamEvent.objects.filter(stream_id=stream).order_by("seq").values_list("seq", flat=True)) == [
        1, 2, 3, 4,
    ]
