"""The audit trail (sealed hash chains) and the watch that turns refusals into audit events."""
