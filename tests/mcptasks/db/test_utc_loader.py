"""The async connections' ``timestamptz`` loader: UTC instants whatever the session's settings."""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
import pytest

from mcptasks.db import async_sql
from tests.support.requirements import require_postgres

#: Instants with the cases a parser can get wrong: milliseconds, microseconds, no fraction, the
#: turn of a day and a year, historical offsets with seconds (local mean time), the far past.
INSTANTS = [
    "2026-11-29 03:21:11.513+00", "2026-11-29 03:21:11.513456+00", "2026-11-29 03:21:11+00",
    "2026-12-31 23:59:59.999999+00", "1890-06-01 12:00:00+00", "0900-01-01 00:00:00+00",
]
ZONES = ["UTC", "Asia/Kathmandu", "America/St_Johns", "Pacific/Chatham", "Asia/Kolkata", "America/New_York"]
DATESTYLES = ["ISO, MDY", "ISO, DMY", "ISO, YMD"]


def _dsn() -> dict[str, Any]:
    return async_sql.conninfo()  # the async connections' own parameters (autocommit)


@pytest.mark.django_db
@pytest.mark.parametrize("datestyle", DATESTYLES)
def test_every_timezone_and_datestyle_reads_the_same_utc_instants(datestyle: str) -> None:
    """Issue 27: the loader parses PostgreSQL's ISO output in C (it was a tenth of a tasks/get's
    CPU in Python). Against psycopg's own loader, for sessions in other zones and date styles."""
    require_postgres()
    literals = ", ".join(f"'{value}'::timestamptz" for value in INSTANTS)
    with psycopg.connect(**_dsn()) as reference:
        reference.execute("SET TimeZone = 'UTC'")
        expected = reference.execute(f"SELECT {literals}").fetchone()  # noqa: S608 (constants)
    assert expected is not None and all(v.utcoffset() == dt.timedelta(0) for v in expected)
    with psycopg.connect(**_dsn()) as conn:
        conn.adapters.register_loader("timestamptz", async_sql.utc_timestamptz_loader())
        conn.execute(f"SET DateStyle = '{datestyle}'")
        for zone in ZONES:
            conn.execute(f"SET TimeZone = '{zone}'")
            got = conn.execute(f"SELECT {literals}").fetchone()  # noqa: S608 (constants)
            assert got == expected, zone
            assert got is not None and all(v.tzinfo is dt.UTC for v in got), zone


@pytest.mark.django_db
def test_what_is_not_iso_output_is_left_to_psycopg() -> None:
    """``infinity`` and BC dates (no datetime holds them) and other date styles go to psycopg's
    loader, which refuses them as before."""
    require_postgres()
    with psycopg.connect(**_dsn()) as conn:
        conn.adapters.register_loader("timestamptz", async_sql.utc_timestamptz_loader())
        for literal in ("infinity", "-infinity", "0044-03-15 12:00:00+00 BC"):
            with pytest.raises(psycopg.DataError):
                conn.execute(f"SELECT '{literal}'::timestamptz").fetchone()  # noqa: S608 (constants)
        for datestyle in ("SQL, DMY", "Postgres, MDY", "German"):
            conn.execute(f"SET DateStyle = '{datestyle}'")
            with pytest.raises(NotImplementedError):
                conn.execute("SELECT now()").fetchone()
