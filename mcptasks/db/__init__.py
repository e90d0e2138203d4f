"""How the service talks to PostgreSQL: connection options, the pooler-aware backend, the async
request-path statements and the write pool. Generic over models: nothing here knows a task."""
