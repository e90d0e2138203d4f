"""The fingerprint of a built-in token's verdict changes with everything the verdict reads."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import F
from django.utils import timezone
from oauth2_provider.models import get_access_token_model, get_application_model

from tenants.auth import authenticate
from tenants.auth_fingerprint import fingerprint_sql, reusable_after, token_checksum
from tenants.context import AuthContext
from tenants.models import Principal, Tenant, TenantApplication, TenantMembership
from tenants.services import add_member, get_or_create_tenant, issue_token
from tests.support.requirements import require_postgres

pytestmark = pytest.mark.django_db

#: The three ways a built-in token names its principal: the client application's linked
#: principal, the client itself (no link), or the token's user (with a membership).
KINDS = ("linked", "client", "user")


class Setup:
    def __init__(self, kind: str, tenant: Tenant, resource_url: str) -> None:
        self.kind, self.tenant, self.resource_url = kind, tenant, resource_url
        self.token = issue_token(tenant=tenant, principal_name="robot", resource=resource_url)
        self.checksum = token_checksum(self.token)
        self.link = TenantApplication.objects.get(application__accesstoken__token_checksum=self.checksum)
        if kind == "client":
            TenantApplication.objects.filter(pk=self.link.pk).update(principal=None)
        if kind == "user":
            user = get_user_model().objects.create_user("ada", password="x" * 20)
            add_member(tenant=tenant, user=user, scopes=["mcp:tools", "mcp:tasks"])
            self.tokens().update(user=user)
        self.ctx = self.verify()

    def tokens(self) -> Any:
        return get_access_token_model().objects.filter(token_checksum=self.checksum)

    def verify(self) -> AuthContext:
        return authenticate(headers={"authorization": f"Bearer {self.token}"}, query_string="",
                            resource_url=self.resource_url)

    def fingerprint(self) -> tuple[Any, ...] | None:
        with connection.cursor() as cursor:
            cursor.execute(fingerprint_sql(), [self.checksum, self.ctx.principal_id])
            row = cursor.fetchone()
        return None if row is None else tuple(row)


#: Edits another process could make (queryset updates: no signal reaches this process's cache),
#: each of something a verdict reads, by the kinds of token it applies to.
CHANGES: dict[str, tuple[tuple[str, ...], Callable[[Setup], Any]]] = {
    "token revoked": (KINDS, lambda s: s.tokens().delete()),
    "token scopes narrowed": (KINDS, lambda s: s.tokens().update(scope="mcp:tools")),
    "token expiry moved": (KINDS, lambda s: s.tokens().update(expires=timezone.now() + timedelta(days=3))),
    "token audience changed": (KINDS, lambda s: s.tokens().update(resource=["https://elsewhere.example/mcp"])),
    "application renamed": (KINDS, lambda s: get_application_model().objects.filter(
        pk=s.link.application_id).update(name="renamed")),
    "application's client id changed": (KINDS, lambda s: get_application_model().objects.filter(
        pk=s.link.application_id).update(client_id="another-client-id")),
    "client's scopes narrowed": (KINDS, lambda s: TenantApplication.objects.filter(pk=s.link.pk).update(
        allowed_scopes="mcp:tools")),
    "client moved to another tenant": (KINDS, lambda s: TenantApplication.objects.filter(pk=s.link.pk).update(
        tenant=get_or_create_tenant(slug="elsewhere"))),
    "client linked to another principal": (KINDS, lambda s: TenantApplication.objects.filter(pk=s.link.pk).update(
        principal=Principal.objects.create(tenant=s.tenant, kind="client", identifier="other", name="other"))),
    "tenant disabled": (KINDS, lambda s: Tenant.objects.filter(pk=s.tenant.pk).update(active=False)),
    "tenant's slug changed": (KINDS, lambda s: Tenant.objects.filter(pk=s.tenant.pk).update(slug="renamed")),
    "principal renamed": (KINDS, lambda s: Principal.objects.filter(pk=s.ctx.principal_id).update(name="renamed")),
    "principal's identifier changed": (KINDS, lambda s: Principal.objects.filter(pk=s.ctx.principal_id).update(
        identifier="renamed")),
    "principal deleted": (KINDS, lambda s: Principal.objects.filter(pk=s.ctx.principal_id).delete()),
    "membership narrowed": (("user",), lambda s: TenantMembership.objects.filter(tenant=s.tenant).update(
        allowed_scopes="mcp:tools")),
    "membership ended": (("user",), lambda s: TenantMembership.objects.filter(tenant=s.tenant).delete()),
    "user renamed": (("user",), lambda s: get_user_model().objects.filter(username="ada").update(username="bob")),
    "user deactivated": (("user",), lambda s: get_user_model().objects.filter(username="ada").update(
        is_active=False)),
}

#: Edits of rows a verdict reads, in columns it does not: the verdict is kept.
KEPT: dict[str, Callable[[Setup], Any]] = {
    "the principal runs a task": lambda s: Principal.objects.filter(pk=s.ctx.principal_id).update(
        active_tasks=F("active_tasks") + 1),
    "the tenant's limits edited": lambda s: Tenant.objects.filter(pk=s.tenant.pk).update(
        max_concurrent_tasks=5, rate_read_per_min=10),
}


@pytest.fixture(autouse=True)
def _postgres() -> None:
    require_postgres()


@pytest.mark.parametrize(("kind", "change"), [(k, name) for name, (kinds, _) in CHANGES.items() for k in kinds])
def test_every_input_of_a_verdict_changes_its_fingerprint(
    kind: str, change: str, tenant: Tenant, resource_url: str
) -> None:
    setup = Setup(kind, tenant, resource_url)
    before = setup.fingerprint()
    assert before is not None and before == setup.fingerprint()  # stable while nothing changes
    CHANGES[change][1](setup)
    assert setup.fingerprint() != before


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("edit", list(KEPT))
def test_columns_a_verdict_does_not_read_leave_it(kind: str, edit: str, tenant: Tenant, resource_url: str) -> None:
    setup = Setup(kind, tenant, resource_url)
    before = setup.fingerprint()
    KEPT[edit](setup)
    assert setup.fingerprint() == before
    assert setup.verify() == setup.ctx  # and a full verification agrees


def test_a_fingerprint_is_kept_only_if_nothing_changed_during_the_verification() -> None:
    row = (7, "a", "b")
    assert reusable_after(row, row) == row
    assert reusable_after((None, "a", "b"), row) is None  # read before the principal was known
    assert reusable_after(row, (7, "a", "c")) is None  # edited while it was verified
    assert reusable_after(None, row) is None and reusable_after(row, None) is None
