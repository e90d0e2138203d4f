"""The append-only audit trail and the signed anchors of its chains."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class AuditEvent(models.Model):
    """An append-only audit record; sealed later into its chain by :func:`mcptasks.audit.trail.seal`.

    ``chain`` (the tenant id at write time, 0 for none) and ``principal_ref`` are kept apart
    from the foreign keys: deleting a tenant or principal nulls the keys but leaves what was
    sealed, and so the chain, intact.
    """

    # Three events a task, each written and then sealed (an update no index lets be HOT): every
    # index and check costs them all (issue 27). The keys are not checked by the database: the
    # writer always has the row in hand, and deleting a tenant or principal still nulls them
    # (Django's SET_NULL). The tenant needs no index of its own: ``auditevent_tenant_time_idx``
    # leads with it. See ``Meta.indexes`` for the others.
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.SET_NULL, null=True, related_name="+",
                               db_index=False, db_constraint=False)
    principal = models.ForeignKey("tenants.Principal", on_delete=models.SET_NULL, null=True, related_name="+",
                                  db_constraint=False)
    chain = models.BigIntegerField(default=0)
    principal_ref = models.BigIntegerField(null=True, blank=True)
    action = models.CharField(max_length=64)
    task_id = models.CharField(max_length=64, blank=True)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    # Set by the sealer: position in the chain, link to the previous event, keyed hash.
    chain_seq = models.BigIntegerField(null=True, blank=True)
    prev_hash = models.CharField(max_length=64, blank=True)
    hash = models.CharField(max_length=64, blank=True)
    sealed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [models.UniqueConstraint(fields=["chain", "chain_seq"], name="auditevent_chain_seq_uniq")]
        indexes = [
            models.Index(fields=["id"], name="auditevent_unsealed_idx", condition=models.Q(sealed_at__isnull=True)),
            models.Index(fields=["tenant", "-created_at"], name="auditevent_tenant_time_idx"),
            # One index each, where ``db_index=True`` made two on PostgreSQL (a plain one and a
            # LIKE one): the pattern operator class serves both the equality filters and the
            # ``flag.`` prefix of the dashboard; nothing looks a task id up by prefix.
            models.Index(fields=["action"], name="auditevent_action_idx", opclasses=["varchar_pattern_ops"]),
            models.Index(fields=["task_id"], name="auditevent_task_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.task_id}"


class AuditAnchor(models.Model):
    """A signed record of a chain's head (or of where pruning cut it); exportable."""

    class Kind(models.TextChoices):
        HEAD = "head", "head"
        PRUNE = "prune", "prune"

    chain = models.BigIntegerField()
    seq = models.BigIntegerField()
    head = models.CharField(max_length=64)
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.HEAD)
    created_at = models.DateTimeField()
    signature = models.CharField(max_length=64)

    class Meta:
        indexes = [models.Index(fields=["chain", "seq"], name="auditanchor_chain_seq_idx")]

    def __str__(self) -> str:
        return f"{self.kind} anchor of chain {self.chain} at {self.seq}"
