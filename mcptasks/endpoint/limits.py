"""Open streams one principal may hold in this web process.

Every GET stream holds a connection and a consumer: without a bound, one principal could
exhaust a web process's connections (issue 25.7). Streams are counted per web process, which is
what they exhaust; the session cap and the size of stored client metadata are the engine's
(:func:`mcptasks.tasks.sessions.open_session`, counted in the database, exact across processes).
"""

from __future__ import annotations

import threading
from collections import defaultdict

#: A principal, as the stream counter keys it: (tenant id, principal id).
Owner = tuple[int, int]


class StreamSlots:
    """Open GET streams per principal in this process: at most ``limit`` distinct streams each.

    A stream the principal already holds may be opened once more (a reconnect, which takes the
    older connection over), so a client that lost its connection is never locked out by its own
    half-closed one; the total stays within twice the limit.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: defaultdict[Owner, dict[str, int]] = defaultdict(dict)

    def acquire(self, owner: Owner, stream_id: str, *, limit: int) -> bool:
        """Take a slot for a connection to ``stream_id``; False when the principal is at its limit."""
        with self._lock:
            held = self._held[owner]
            connections = held.get(stream_id, 0)
            if limit > 0 and (connections >= 2 or (connections == 0 and len(held) >= limit)):
                if not held:
                    del self._held[owner]
                return False
            held[stream_id] = connections + 1
            return True

    def release(self, owner: Owner, stream_id: str) -> None:
        """Give back the slot of one connection to ``stream_id``."""
        with self._lock:
            held = self._held.get(owner)
            if held is None or stream_id not in held:
                return
            held[stream_id] -= 1
            if held[stream_id] <= 0:
                del held[stream_id]
            if not held:
                del self._held[owner]

    def open_streams(self, owner: Owner) -> int:
        """How many distinct streams ``owner`` holds in this process."""
        with self._lock:
            return len(self._held.get(owner, ()))


#: This process's open GET streams.
streams = StreamSlots()
