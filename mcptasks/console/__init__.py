"""What operators and auditors see: the admin, the dashboard, the audit-review API, metrics, pages."""
