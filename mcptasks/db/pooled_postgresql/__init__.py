"""PostgreSQL behind a transaction-mode pooler (``MCPTASKS_DB_POOLER=transaction``): see ``base``."""
