"""Holding a tenant's and a principal's counter rows locked from another connection."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from django.db import connections, transaction


@contextlib.contextmanager
def counter_rows_held(*, tenant_id: int, principal_id: int) -> Iterator[None]:
    """While inside, another thread's transaction holds the lock a counter ``UPDATE`` takes on
    both rows (foreign keys to them may still be checked): whatever needs those locks waits."""
    from tenants.models import Principal, Tenant

    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                Tenant.objects.select_for_update(no_key=True).filter(pk=tenant_id).get()
                Principal.objects.select_for_update(no_key=True).filter(pk=principal_id).get()
                locked.set()
                release.wait(30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(10), "the rows were not locked in time"
        yield
    finally:
        release.set()
        holder.join(30)
