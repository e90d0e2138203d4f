"""A bare Channels consumer that answers every POST with a constant JSON-RPC result.

The ceiling of any Channels app under the same ASGI server: ``daphne bench.peers.bare_consumer:application``.
"""

from __future__ import annotations

import os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mcptasks.settings")

import django  # noqa: E402

django.setup()

from channels.generic.http import AsyncHttpConsumer  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import re_path  # noqa: E402

BODY = b'{"jsonrpc":"2.0","id":1,"result":{"taskId":"x","status":"working"}}'


class Bare(AsyncHttpConsumer):
    async def handle(self, body: bytes) -> None:
        await self.send_response(200, BODY, headers=[(b"content-type", b"application/json")])


application = ProtocolTypeRouter({"http": URLRouter([re_path(r"", Bare.as_asgi())])})
