"""Holding rows locked from another connection: another thread's transaction left open."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from django.db import connections, transaction


@contextlib.contextmanager
def transaction_held(body: Callable[[], object], *, hold_s: float = 30.0) -> Iterator[threading.Event]:
    """While inside (at most ``hold_s``), another thread's transaction that ran ``body`` stays
    open, holding whatever ``body`` locked or wrote. Yields an event set once it has ended; an
    exception ``body`` raised is raised on leaving."""
    ready, release, ended = threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold() -> None:
        try:
            with transaction.atomic():
                body()
                ready.set()
                release.wait(hold_s)
        except BaseException as exc:  # raised by the caller's thread
            errors.append(exc)
        finally:
            ended.set()
            ready.set()
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert ready.wait(10), "the transaction did not start in time"
        if errors:
            raise errors[0]
        yield ended
    finally:
        release.set()
        holder.join(30)
    if errors:
        raise errors[0]


def counter_rows_held(*, tenant_id: int, principal_id: int, for_update: bool = False,
                      hold_s: float = 30.0) -> contextlib.AbstractContextManager[threading.Event]:
    """:func:`transaction_held` holding the lock a counter ``UPDATE`` takes on a tenant's and a
    principal's rows (foreign keys to them may still be checked): whatever needs those locks
    waits. ``for_update``: the strongest row lock instead (``SELECT ... FOR UPDATE``, as a
    recount takes), which a foreign key check waits for too."""
    from tenants.models import Principal, Tenant

    def lock() -> None:
        Tenant.objects.select_for_update(no_key=not for_update).filter(pk=tenant_id).get()
        Principal.objects.select_for_update(no_key=not for_update).filter(pk=principal_id).get()

    return transaction_held(lock, hold_s=hold_s)
