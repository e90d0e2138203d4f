"""What a database outage raises, named once for the layers above the ORM.

The HTTP layer answers an outage with a retryable 503 wherever it surfaces (a read in a handler,
a session lookup, authentication), but it must not import the ORM to know what an outage is:
it catches :data:`DATABASE_UNAVAILABLE` instead.
"""

from __future__ import annotations

from django.db import InterfaceError, OperationalError

#: The exceptions that mean the database is away (connection refused, lost or closed): retryable.
DATABASE_UNAVAILABLE: tuple[type[Exception], ...] = (OperationalError, InterfaceError)


def database_unavailable() -> Exception:
    """An outage exception, for answering one that was caught (and logged) elsewhere."""
    return OperationalError()
