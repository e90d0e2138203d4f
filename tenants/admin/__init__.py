"""Admin for tenants: limits are edited here at run time and apply within seconds.

Every admin of both apps is *tenant-scoped* (operators see the tenants :mod:`tenants.access`
gives them, and change only those they manage) and *audited* (every add, change and delete is an
audit event naming the operator, the object and each changed field before and after; secrets
are never written, only that they changed): :mod:`.scoping` is their base. The admins register
when this package is imported (the admin's autodiscovery).
"""

from tenants.admin import issuers, oauth, tenancy, webhooks  # noqa: F401  (registers the admins)
from tenants.admin.scoping import TENANT_FILTER, ScopedAuditedAdmin

__all__ = ["TENANT_FILTER", "ScopedAuditedAdmin"]
