"""The mcptasks settings: one typed definition each, with its default and meaning.

``settings.py`` fills ``settings.MCPTASKS`` from the environment (``MCPTASKS_<NAME>``, see
:mod:`tenants.infra.typed_settings`); :func:`get` returns the cached, typed view;
``docs/settings.md`` is generated from these fields (``manage.py mcptasks_settings_doc``), and a
system check warns about keys that name no setting. The endpoint's path and public URL, and
anonymous access, are the tenants app's settings (``tenants.conf``): they define the OAuth
protected resource.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tenants.infra.typed_settings import Loader, setting


@dataclass(frozen=True)
class AppSettings:
    """Every mcptasks setting: type, default and meaning."""

    ALLOWED_ORIGINS: tuple[str, ...] = setting(
        (), "Allowed browser `Origin`s besides same-origin (`*` allows all). Any other Origin gets 403."
    )
    MAX_BODY_BYTES: int = setting(4 * 1024 * 1024, "Larger POST bodies get 413.")
    SESSION_IDLE_TIMEOUT_S: int = setting(
        24 * 3600, "Sessions idle this long (and ended sessions after it) are deleted by cleanup."
    )
    SESSION_INIT_TIMEOUT_S: int = setting(
        300, "Sessions that never sent `notifications/initialized` are deleted by cleanup after this long."
    )
    MAX_SESSIONS_PER_PRINCIPAL: int = setting(
        1000,
        "Live sessions (not ended, not idle, not an expired uninitialized one) one principal may hold. "
        "`initialize` past it gets -32010 \"Too many sessions\". 0: no limit.",
    )
    MAX_STREAMS_PER_PRINCIPAL: int = setting(
        200,
        "Open GET (SSE) streams and 2026-07-28 `subscriptions/listen` streams one principal may hold on one web "
        "process (a reconnect of a stream it holds is always allowed). Past it: HTTP 429 \"Too many open "
        "streams\" with `Retry-After`. 0: no limit.",
    )
    CLIENT_METADATA_MAX_BYTES: int = setting(
        8192,
        "Largest `clientInfo`, and largest client capabilities (as compact JSON), stored for a session or a "
        "2026-07-28 request. Larger ones get -32602.",
    )
    SSE_RETRY_MS: int = setting(1000, "`retry:` hint sent in priming events and before the server closes a connection.")
    SSE_KEEPALIVE_S: float = setting(15.0, "Keep-alive comment interval on idle SSE streams.")
    SSE_MAX_STREAM_S: float = setting(
        300.0,
        "After this long, the server closes an SSE connection (with `retry:`). "
        "The client resumes with `Last-Event-ID` and loses nothing.",
    )
    SSE_RETENTION_S: int = setting(600, "How long SSE events are kept for replay.")
    STREAM_MAX_EVENTS: int = setting(
        1000,
        "Stored events per SSE stream: past it, the oldest are deleted as new ones are appended (a client resuming "
        "from further back misses them, as after `SSE_RETENTION_S`), so no tool can fill the database. `0`: no cap.",
    )
    PROGRESS_MAX_PER_S: float = setting(
        10.0,
        "Most `notifications/progress` one run sends per second (after a burst of as many). Faster reports are "
        "coalesced: only the latest is kept and sent when the rate allows (a run's last report goes out before its "
        "outcome). `0`: no limit.",
    )
    TOOLS_PAGE_SIZE: int = setting(50, "`tools/list` page size.")
    TASK_LIST_PAGE_SIZE: int = setting(50, "`tasks/list` page size.")
    ASYNC_READS: bool = setting(
        True,
        "PostgreSQL: read the request's session and task over an async connection per event loop instead of "
        "through the ORM's thread hop (`mcptasks/db/async_sql.py`). Off: every read uses the ORM.",
    )
    WRITE_THREADS: int = setting(
        4,
        "PostgreSQL: request-path writes (creating a session, cancelling, the task creations one statement does "
        "not settle) run on this many threads per web process, each with its own connection, instead of queuing "
        "on the one thread every ORM call from async code shares (`mcptasks/db/write_pool.py`); task creations "
        "run as one statement on a pool of as many async connections per event loop (`mcptasks/db/write_conns.py`, "
        "with `ASYNC_READS`, not behind a pooler). 0: writes share that thread, and creations use the ORM.",
    )
    WRITE_QUEUE_TIMEOUT_S: float = setting(
        10.0,
        "PostgreSQL: a request-path write that waits longer than this for a free write thread (or connection) "
        "fails with 503 "
        "(`Retry-After`) instead of hanging behind writes blocked on a lock.",
    )
    DB_POOLER: str = setting(
        "none",
        "`transaction`: the database URL points at a transaction-mode pooler (PgBouncer `pool_mode = transaction`): "
        "no named prepared statements, no server-side cursors, no session state; the timeouts below are set per "
        "transaction (`SET LOCAL`). `none`: a direct PostgreSQL connection (or a session-mode pooler). "
        "See [operations](operations.md#behind-pgbouncer).",
    )
    DB_LOCK_TIMEOUT_MS: int = setting(
        10_000, "PostgreSQL `lock_timeout`: a statement waiting longer for a lock fails (503, retryable). 0: none."
    )
    DB_STATEMENT_TIMEOUT_MS: int = setting(
        120_000, "PostgreSQL `statement_timeout` of the service's connections. 0: none (set 0 for `migrate`)."
    )
    DB_IDLE_IN_TRANSACTION_TIMEOUT_MS: int = setting(
        60_000,
        "PostgreSQL `idle_in_transaction_session_timeout`: a connection idle inside a transaction this long (a "
        "frozen or vanished client) is closed by the server, releasing its locks. 0: none.",
    )
    DB_KEEPALIVES_IDLE_S: int = setting(
        30,
        "TCP keepalives on database connections (libpq `keepalives_idle`; probes every 10 s, 3 lost probes "
        "close it): a peer gone without FIN/RST is noticed in about this plus 30 s. 0: the OS defaults.",
    )
    DB_GENERIC_PLANS: bool = setting(True, "PostgreSQL, `DB_POOLER=none`: prepared statements (claim, finish, creation "
        "and batched reads) use a generic plan from their first execution (`plan_cache_mode = force_generic_plan`), "
        "not re-planned on every one. Needs autovacuum (check `mcptasks.W007`): a plan made before a table was "
        "analyzed is kept until it is. See [operations](operations.md#postgresql-plans-of-prepared-statements).")
    SYNC_THREADS: int = setting(
        8,
        "PostgreSQL: threads of each process's default executor, where ORM calls from async code that do not "
        "share the request thread run (readiness, cleanup, audit sealing, issuer lookups); each holds its own "
        "connection. Bounded (1-64) so a process's connections are too; see docs/operations.md.",
    )
    ERA2026_TASKS_NAME_OPTIONAL: bool = setting(
        False,
        "MCP 2026-07-28: accept `tasks/get`, `tasks/update` and `tasks/cancel` without an `Mcp-Name` header (a "
        "present one must still match the taskId). The published Python client of the tasks extension (`mcp` 2.3 "
        "under FastMCP 4.0) sends none there. Off: a missing `Mcp-Name` is HTTP 400 / -32020, as SEP-2243 requires. "
        "`manage.py serve` (development) turns it on unless the variable is set, and says so.",
        shown="`0` (`1` under `serve`)",
    )
    TASK_RESULT_RECHECK_S: float = setting(
        5.0,
        "A blocked `tasks/result` wakes on a channel-layer signal. This is the backstop re-check interval: the "
        "stream re-reads the task and sends its stored events whose push was lost.",
    )
    REQUEST_RETENTION_S: int = setting(
        600, "Plain requests untouched this long are deleted by cleanup once finished (or when their session is gone)."
    )
    CLEANUP_INTERVAL_S: float = setting(60.0, "How often web processes and workers run cleanup.")
    GC_TUNING: bool = setting(True, "Web processes and workers freeze what start-up made and collect garbage less "
        "often (thresholds 20000, 50, 50 for Python's 700, 10, 10): full collections paused every request of a process "
        "for tens of ms (`mcptasks/processes/gc_tuning.py`). Off keeps Python's defaults.")
    AUDIT_SEAL_INTERVAL_S: float = setting(1.0, "How often workers (and a web process running the embedded worker) "
        "try to seal new audit events into their chains, one sealer at a time across all processes. A web process "
        "beside worker processes seals only events left unsealed for five intervals (no worker sealing).")
    AUDIT_ANCHOR_RETENTION_S: int = setting(
        86400, "Head anchors older than this are deleted by cleanup (the newest of each chain is always kept)."
    )
    AUDIT_REFUSAL_EVERY_S: float = setting(
        10.0,
        "Refusals (authentication failures, 429s, quota and scope refusals, failed and cross-tenant lookups) are "
        "audited at most once per window of this many seconds per kind and subject (principal, client IP or IPv6 "
        "/64, owner tenant), across processes; the rest are counted and written as one `audit.suppressed` event "
        "per tenant and kind when the window ends.",
    )
    AUDIT_REFUSAL_BUDGET: int = setting(
        20, "Refusal events of one kind written per `MCPTASKS_AUDIT_REFUSAL_EVERY_S` window in all, whatever the "
        "number of subjects (across processes); the rest are counted in `audit.suppressed`.",
    )
    DASHBOARD_REFRESH_S: float = setting(
        30.0, "How often an open operator dashboard page refetches its figures (as JSON), in seconds (at least 1)."
    )
    WATCH_WINDOW_S: int = setting(60, "Window of the suspicious-pattern counters.")
    WATCH_LOOKUP_FAILURES: int = setting(
        20, "Missing-task lookups by one principal within the window that flag enumeration (`flag.enumeration`)."
    )
    WATCH_FAST_POLLS: int = setting(
        30, "Polls sooner than `pollInterval` by one principal within the window that flag `flag.fast_polling` "
        "(noticed where the tenant has a read rate limit: poll notes are kept only then).",
    )
    WATCH_AUTH_FAILURES: int = setting(
        10, "Authentication failures from one client IP within the window that flag `flag.auth_failures`."
    )
    CLEANUP_BATCH_SIZE: int = setting(500, "Rows deleted per cleanup transaction.")
    EMBEDDED_WORKER: bool = setting(False, "Run the worker inside the web process.", shown="`0` (`1` under `serve`)")
    WORKER_CONCURRENCY: int = setting(8, "Tools a worker runs at once.")
    WORKER_TENANT_RESERVED_SLOTS: int = setting(
        1,
        "Slots of each worker that one tenant can never fill: a tenant runs at most `concurrency` minus this many "
        "tools at once in one worker (at least 1), so another tenant's task starts at once however many long "
        "tasks one tenant queues (runs waiting for their client do not count). `0`: one tenant may use every slot.",
    )
    WORKER_LEASE_S: float = setting(30.0, "Lease length. A task whose lease lapses is reclaimed.")
    WORKER_HEARTBEAT_S: float = setting(
        5.0, "Lease renewal and cancel-flag read interval. Must be shorter than the lease."
    )
    WORKER_POLL_S: float = setting(2.0, "Backstop claim polling when no wake-up arrives.")
    WORKER_CLAIM_DELAY_S: float = setting(
        0.02,
        "A worker told of new tasks claims them this long after the first announcement, together with "
        "those created meanwhile: one claim per burst instead of one per task in every worker. The "
        "claim no longer competes with the creating request for the CPU (issue 27). `0`: claim at once.",
    )
    WORKER_SHUTDOWN_GRACE_S: float = setting(
        20.0, "On SIGTERM, running tools get this long before they are handed back."
    )
    TOOL_DEFAULT_TIMEOUT_S: float = setting(
        3600.0,
        "Time limit of a run of a tool that declares no `timeout_s`: past it the run is stopped and its task fails "
        '("Tool <name> timed out after <n>s"), so no tool holds a worker slot forever. `0`: no limit.',
    )
    TASK_MAX_ATTEMPTS: int = setting(3, "Attempts of a retryable tool after worker crashes.")
    RESULT_MAX_BYTES: int = setting(
        16 * 1024 * 1024,
        "Largest tool result stored. A larger one, one that is not JSON, or one with NUL characters or "
        'unpaired surrogates fails its task at once ("Tool returned a result that cannot be stored: …", '
        "and -32603 from `tasks/result`).",
    )
    REDIS_SOCKET_TIMEOUT_S: float = setting(
        10.0, "Channel layer: socket read timeout. Must exceed the layer's 5 s blocking read (check `mcptasks.E004`)."
    )
    REDIS_CONNECT_TIMEOUT_S: float = setting(2.0, "Channel layer: connect timeout.")
    REDIS_HEALTH_CHECK_S: float = setting(15.0, "Channel layer: a connection idle this long is pinged before use.")
    REDIS_LAYER_POOL_SIZE: int = setting(
        50, "Channel layer: connections per event loop (a blocking pool: callers wait for a free one)."
    )
    REDIS_LAYER_POOL_TIMEOUT_S: float = setting(5.0, "Channel layer: longest wait for a free connection.")
    LAYER_SEND_TIMEOUT_S: float = setting(
        0.5, "Longest wait for a wake-up or stream push; past it the send is dropped (receivers re-read the database)."
    )
    LAYER_FALLBACK_POLL_S: float = setting(
        1.0,
        "After a channel-layer failure, open streams re-read the database and try to rejoin their groups this often.",
    )
    WEBHOOK_RETRY_PERIOD_S: float = setting(
        24 * 3600.0,
        "How long a webhook delivery is retried (exponential backoff with jitter) before it is given up; an "
        "endpoint with no successful delivery for this long is disabled (audited, logged).",
    )
    WEBHOOK_BACKOFF_BASE_S: float = setting(
        5.0, "First retry delay of a failed webhook delivery; doubled per attempt, and each delay is "
        "half fixed, half random (jitter)."
    )
    WEBHOOK_BACKOFF_MAX_S: float = setting(3600.0, "Longest delay between two attempts of one webhook delivery.")
    WEBHOOK_TIMEOUT_S: float = setting(10.0, "Longest time one webhook request may take (connect, send, answer).")
    WEBHOOK_LEASE_S: float = setting(
        60.0,
        "A worker's claim on a webhook delivery; a delivery whose worker died is retried once it lapses "
        "(at least once: receivers deduplicate by `webhook-id`).",
    )
    WEBHOOK_POLL_S: float = setting(1.0, "How often a worker looks for due webhook deliveries.")
    WEBHOOK_CONCURRENCY_PER_ENDPOINT: int = setting(
        4, "Webhook requests in flight to one endpoint at once, across all workers."
    )
    WEBHOOK_RETENTION_S: int = setting(
        7 * 86400, "Delivered and given-up webhook deliveries older than this are deleted by cleanup."
    )
    WEBHOOK_WORKER_THREADS: int = setting(8, "Webhook requests one worker sends at once (all endpoints).")
    METRICS_TOKEN: str = setting(
        "",
        "Bearer token `GET /metrics` requires. Unset: `/metrics` answers only in `DEBUG`, and only requests from "
        "a loopback client (check `mcptasks.W005` warns outside `DEBUG`).",
        shown="unset",
    )


_loader: Loader[AppSettings] = Loader(AppSettings, "MCPTASKS")
#: The current settings (cached; rebuilt when ``settings.MCPTASKS`` changes).
get = _loader.get
#: Forget the cached settings (after changing ``settings.MCPTASKS`` in place).
reset = _loader.reset
#: Keys of ``settings.MCPTASKS`` that name no setting.
unknown_keys = _loader.unknown_keys


@dataclass(frozen=True)
class DeploymentSettings:
    """The process and deployment variables ``settings.py`` turns into Django settings.

    Read once at startup by :func:`tenants.infra.typed_settings.read_env` like the app settings; some
    keep the names the ecosystem uses (``DATABASE_URL``, ``SECRET_KEY``...).
    """

    ENV_FILE: str = setting(
        "", "A file of `NAME=value` lines read into the environment at startup (never implicitly).", shown="unset"
    )
    DATABASE_URL: str = setting(
        "",
        "Any django-environ URL. SQLite runs in WAL mode with IMMEDIATE transactions. "
        "Use `postgres://…` (psycopg 3) in production.",
        env="DATABASE_URL",
        shown="`sqlite:///<VAR_DIR>/mcptasks.sqlite3`",
    )
    CONN_MAX_AGE: int = setting(
        600,
        "PostgreSQL: seconds a connection is kept for reuse (health-checked before each reuse). "
        "`0` opens one per request (much slower).",
    )
    REDIS_URL: str = setting(
        "",
        "Set it to use Redis for the channel layer (channels-redis) and the shared rate-limit counters. "
        "Unset: in-memory layer and in-process counters (one process only). "
        "See [operations](operations.md#redis-timeouts-pools-and-outages).",
        env="REDIS_URL",
        shown="unset",
    )
    SECRET_KEY: str = setting(
        "dev-insecure-mcptasks-key-change-me-0123456789abcdef",
        "Signs cursors and sessions. Web processes and workers refuse to start with the development key "
        "unless `DEBUG` is on (`manage.py serve` and tests excepted).",
        env="SECRET_KEY",
        shown="dev key",
    )
    SECRETS_KEY: str = setting(
        "",
        "Fernet key(s), comma-separated (first encrypts, all decrypt), for secrets stored in the database "
        "(external issuers' shared secrets). Set it so that rotating `SECRET_KEY` does not make them unreadable.",
        shown="derived from `SECRET_KEY`",
    )
    AUDIT_KEY: str = setting(
        "",
        "HMAC key of the audit chains (keep it apart from `SECRET_KEY` and from database backups: whoever holds it "
        "can rewrite the chain undetected). System check `mcptasks.W002` warns when unset outside `DEBUG`.",
        shown="derived from `SECRET_KEY`",
    )
    DEBUG: bool = setting(False, "Django debug.", env="DEBUG")
    ALLOWED_HOSTS: tuple[str, ...] = setting(
        ("127.0.0.1", "localhost", "[::1]", "testserver"),
        "`Host` header allow-list (comma-separated). Requests to `/mcp` with another Host get 400 "
        "(DNS-rebinding protection).",
        env="ALLOWED_HOSTS",
        shown="`127.0.0.1,localhost,[::1],testserver`",
    )
    ACCESS_TOKEN_EXPIRE_S: int = setting(3600, "Lifetime of tokens from the built-in authorization server.")
    DEMO_TOOLS: bool = setting(
        False,
        "Install the demo tools, resources and prompts (for trying the server out: anyone who may call tools can "
        "make them sleep, fail and flood progress). `manage.py serve` turns them on; system check `mcptasks.W006` "
        "warns when they are on while `DEBUG` is off.",
        shown="`0` (`1` under `serve`)",
    )
    CONFORMANCE_FIXTURES: bool = setting(False, "Install the conformance-suite fixtures.")
    EXTRA_APPS: tuple[str, ...] = setting((), "More Django apps (comma-separated) whose `tools.py` to load.")
    CHANNEL_PREFIX: str = setting(
        "mcptasks", "Prefix of channel-layer and Redis keys (separates deployments sharing a Redis)."
    )
    VAR_DIR: str = setting("", "Where the embedded SQLite database lives.", shown="`./var`")
    TEST_SQLITE_FILE: str = setting(
        "", "Tests on SQLite: the test database file (instead of an in-memory database).", shown="unset"
    )
    LOG_LEVEL: str = setting("INFO", "Root log level. Tokens are never logged.", env="LOG_LEVEL")
    LOG_FORMAT: str = setting(
        "plain",
        "`plain` (one text line per record) or `json`: one JSON object per line with `ts`, `level`, `logger`, "
        "`message` and the `request_id`, `tenant`, `task_id` and `trace_id` in scope (null where none), messages "
        "clipped to 2000 characters and credentials redacted. See [operations](operations.md#traces-and-logs).",
    )
    # --- TLS and cookies (see operations.md, "Running behind a TLS proxy") ---
    SESSION_COOKIE_SECURE: bool = setting(
        True, "Send the session cookie over HTTPS only.", env="SESSION_COOKIE_SECURE", shown="`1` (`0` with `DEBUG`)"
    )
    CSRF_COOKIE_SECURE: bool = setting(
        True, "Send the CSRF cookie over HTTPS only.", env="CSRF_COOKIE_SECURE", shown="`1` (`0` with `DEBUG`)"
    )
    SESSION_COOKIE_AGE: int = setting(
        8 * 3600, "Seconds an operator's (admin, console, sign-in) session lasts.", env="SESSION_COOKIE_AGE"
    )
    SECURE_HSTS_SECONDS: int = setting(
        31_536_000,
        "`Strict-Transport-Security` max-age sent on HTTPS responses (0: none).",
        env="SECURE_HSTS_SECONDS",
        shown="`31536000` (`0` with `DEBUG`)",
    )
    SECURE_HSTS_INCLUDE_SUBDOMAINS: bool = setting(
        False, "Add `includeSubDomains` to HSTS (only if every subdomain is HTTPS).",
        env="SECURE_HSTS_INCLUDE_SUBDOMAINS",
    )
    SECURE_HSTS_PRELOAD: bool = setting(
        False, "Add `preload` to HSTS (before submitting the domain to browsers' preload lists).",
        env="SECURE_HSTS_PRELOAD",
    )
    SECURE_SSL_REDIRECT: bool = setting(
        False,
        "Redirect plain-HTTP requests to HTTPS (`/healthz`, `/readyz`, `/metrics` exempt, for internal probes). "
        "Behind a TLS proxy it needs `SECURE_PROXY_SSL_HEADER`, or every request loops.",
        env="SECURE_SSL_REDIRECT",
    )
    SECURE_PROXY_SSL_HEADER: str = setting(
        "",
        "Header by which the TLS-terminating proxy says the client used HTTPS (e.g. `X-Forwarded-Proto`, value "
        "`https`). Set it only if the proxy always sets (never passes on) that header.",
        env="SECURE_PROXY_SSL_HEADER",
        shown="unset",
    )
    CSRF_TRUSTED_ORIGINS: tuple[str, ...] = setting(
        (),
        "Origins (e.g. `https://mcp.example.com`) whose form POSTs are accepted besides the request's own "
        "(comma-separated). The origin of `MCPTASKS_PUBLIC_URL` is always added.",
        env="CSRF_TRUSTED_ORIGINS",
    )
    OAUTH_HTTP_REDIRECTS: bool = setting(
        True,
        "Allow plain-http redirect URIs for applications of the built-in AS (native clients' loopback callbacks, "
        "RFC 8252). Off: https only (check `oauth2_provider.W008` otherwise warns under `check --deploy`).",
    )


#: Deployment settings whose default is relaxed with ``DEBUG`` on (plain-HTTP development), unless
#: set explicitly: secure by default everywhere else.
DEBUG_DEFAULTS: dict[str, Any] = {"SESSION_COOKIE_SECURE": False, "CSRF_COOKIE_SECURE": False, "SECURE_HSTS_SECONDS": 0}


def deployment(explicit: dict[str, Any]) -> DeploymentSettings:
    """The deployment settings from the variables that are set (``read_env``), with the
    :data:`DEBUG_DEFAULTS` applied to those not set when ``DEBUG`` is on."""
    settings = DeploymentSettings(**explicit)
    if settings.DEBUG:
        settings = dataclasses.replace(settings, **{k: v for k, v in DEBUG_DEFAULTS.items() if k not in explicit})
    return settings
