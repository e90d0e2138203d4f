"""Running async database code from a sync test, on a fresh event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


def run_closing(body: Callable[[], Awaitable[Any]]) -> Any:
    """``body()`` on a fresh event loop; that loop's write pool and read connection closed after
    (each event loop has its own, see :mod:`mcptasks.db.write_conns` and :mod:`mcptasks.db.async_sql`)."""
    from mcptasks.db import async_sql, write_conns

    async def main() -> Any:
        try:
            return await body()
        finally:
            await write_conns.close()
            await async_sql.close()

    return asyncio.run(main())
