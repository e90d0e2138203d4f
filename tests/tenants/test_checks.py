"""The tenants app's database checks before ``migrate`` has created their tables."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tenants import checks


@pytest.mark.django_db
def test_issuer_checks_send_no_query_that_would_fail_before_migrate(monkeypatch: pytest.MonkeyPatch) -> None:
    # migrate runs the database checks before it creates the tables: a query on a missing table
    # is an ERROR line in the database server's log of every fresh deployment.
    monkeypatch.setattr(type(connection.introspection), "table_names", lambda self, *a, **k: ["django_migrations"])
    with CaptureQueriesContext(connection) as sent:
        assert checks.shared_issuers_name_their_tenant() == []
        assert checks.issuer_rows_never_share_a_token() == []
    assert not [q for q in sent.captured_queries if "tenants_externalissuer" in q["sql"]]


@pytest.mark.django_db
def test_issuer_checks_read_the_table_once_it_exists() -> None:
    with CaptureQueriesContext(connection) as sent:
        assert checks.shared_issuers_name_their_tenant() == []
    assert [q for q in sent.captured_queries if "tenants_externalissuer" in q["sql"]]


@pytest.mark.django_db
def test_issuer_checks_report_nothing_while_the_database_is_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.db import OperationalError

    def unreachable(self: object, *args: object, **kwargs: object) -> list[str]:
        raise OperationalError("connection refused")

    monkeypatch.setattr(type(connection.introspection), "table_names", unreachable)
    assert checks.shared_issuers_name_their_tenant() == []
    assert checks.issuer_rows_never_share_a_token() == []
