"""What one principal may make the server hold: stored client metadata, sessions, open streams.

Sessions and their client metadata live in the database (24 h idle), and every GET stream holds
a connection and a consumer: without bounds, one principal could grow the session table by
megabytes per request or exhaust a web process's connections (issue 25.7). The session cap is
counted in the database (exact across processes, see ``services.open_session``); open streams
are counted per web process, which is what they exhaust.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from typing import Any

from . import conf
from .protocol.errors import invalid_params

#: A principal, as the stream counter keys it: (tenant id, principal id).
Owner = tuple[int, int]


def check_client_metadata(*, client_info: Any, capabilities: Any) -> None:
    """Refuse (-32602) a ``clientInfo`` or capabilities object larger than ``CLIENT_METADATA_MAX_BYTES``."""
    limit = conf.get().CLIENT_METADATA_MAX_BYTES
    for name, value in (("clientInfo", client_info), ("capabilities", capabilities)):
        size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
        if size > limit:
            raise invalid_params(f"Invalid params: {name} is too large ({size} bytes; the limit is {limit} bytes)",
                                 {"field": name, "limit": limit})


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
