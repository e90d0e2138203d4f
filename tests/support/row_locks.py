"""Holding a tenant's and a principal's counter rows locked from another connection."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from django.db import connections, transaction


@contextlib.contextmanager
def counter_rows_held(*, tenant_id: int, principal_id: int, for_update: bool = False,
                      hold_s: float = 30.0) -> Iterator[threading.Event]:
    """While inside (at most ``hold_s``), another thread's transaction holds the lock a counter
    ``UPDATE`` takes on both rows (foreign keys to them may still be checked): whatever needs
    those locks waits. ``for_update``: the strongest row lock instead (``SELECT ... FOR UPDATE``,
    as a recount or a session's principal check takes), which a foreign key check waits for too.
    Yields an event set once the locks are released."""
    from tenants.models import Principal, Tenant

    locked, release, released = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                Tenant.objects.select_for_update(no_key=not for_update).filter(pk=tenant_id).get()
                Principal.objects.select_for_update(no_key=not for_update).filter(pk=principal_id).get()
                locked.set()
                release.wait(hold_s)
        finally:
            released.set()
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(10), "the rows were not locked in time"
        yield released
    finally:
        release.set()
        holder.join(30)
