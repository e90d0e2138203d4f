"""The mcptasks settings: one typed definition each, with its default and meaning.

``settings.py`` fills ``settings.MCPTASKS`` from the environment (``MCPTASKS_<NAME>``, see
:mod:`tenants.typed_settings`); :func:`get` returns the cached, typed view;
``docs/settings.md`` is generated from these fields (``manage.py mcptasks_settings_doc``), and a
system check warns about keys that name no setting. The endpoint's path and public URL, and
anonymous access, are the tenants app's settings (``tenants.conf``): they define the OAuth
protected resource.
"""

from __future__ import annotations

from dataclasses import dataclass

from tenants.typed_settings import Loader, setting


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
    SSE_RETRY_MS: int = setting(1000, "`retry:` hint sent in priming events and before the server closes a connection.")
    SSE_KEEPALIVE_S: float = setting(15.0, "Keep-alive comment interval on idle SSE streams.")
    SSE_MAX_STREAM_S: float = setting(
        300.0,
        "After this long, the server closes an SSE connection (with `retry:`). "
        "The client resumes with `Last-Event-ID` and loses nothing.",
    )
    SSE_RETENTION_S: int = setting(600, "How long SSE events are kept for replay.")
    TOOLS_PAGE_SIZE: int = setting(50, "`tools/list` page size.")
    TASK_LIST_PAGE_SIZE: int = setting(50, "`tasks/list` page size.")
    ASYNC_READS: bool = setting(
        True,
        "PostgreSQL: read the request's session and task over an async connection per event loop instead of "
        "through the ORM's thread hop (`mcptasks/fastreads.py`). Off: every read uses the ORM.",
    )
    WRITE_THREADS: int = setting(
        4,
        "PostgreSQL: request-path writes (creating a task-augmented task or a session, cancelling) run on this "
        "many threads per web process, each with its own connection, instead of queuing on the one thread every "
        "ORM call from async code shares (`mcptasks/dbwrites.py`). 0: they share that thread.",
    )
    ERA2026_TASKS_NAME_OPTIONAL: bool = setting(
        False,
        "MCP 2026-07-28: accept `tasks/get`, `tasks/update` and `tasks/cancel` without an `Mcp-Name` header (a "
        "present one must still match the taskId). The published Python client of the tasks extension (`mcp` 2.3 "
        "under FastMCP 4.0) sends none there. Off: a missing `Mcp-Name` is HTTP 400 / -32020, as SEP-2243 requires.",
    )
    TASK_RESULT_RECHECK_S: float = setting(
        5.0, "A blocked `tasks/result` wakes on a channel-layer signal. This is the backstop re-check interval."
    )
    REQUEST_RETENTION_S: int = setting(
        600, "Plain requests untouched this long are deleted by cleanup once finished (or when their session is gone)."
    )
    CLEANUP_INTERVAL_S: float = setting(60.0, "How often web processes and workers run cleanup.")
    AUDIT_SEAL_INTERVAL_S: float = setting(
        1.0,
        "How often workers and web processes try to seal new audit events into their chains "
        "(one sealer at a time across all processes).",
    )
    AUDIT_ANCHOR_RETENTION_S: int = setting(
        86400, "Head anchors older than this are deleted by cleanup (the newest of each chain is always kept)."
    )
    AUDIT_REFUSAL_EVERY_S: float = setting(
        10.0,
        "Refusals (authentication failures, 429s, quota and scope refusals, failed lookups) are audited at most "
        "once per this many seconds per kind and principal (or client IP) and process; the next event carries "
        "how many were not written (`suppressed`).",
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
    WORKER_LEASE_S: float = setting(30.0, "Lease length. A task whose lease lapses is reclaimed.")
    WORKER_HEARTBEAT_S: float = setting(
        5.0, "Lease renewal and cancel-flag read interval. Must be shorter than the lease."
    )
    WORKER_POLL_S: float = setting(2.0, "Backstop claim polling when no wake-up arrives.")
    WORKER_SHUTDOWN_GRACE_S: float = setting(
        20.0, "On SIGTERM, running tools get this long before they are handed back."
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
    METRICS_TOKEN: str = setting(
        "",
        "Bearer token `GET /metrics` requires. Unset: `/metrics` answers only requests from loopback.",
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

    Read once at startup by :func:`tenants.typed_settings.read_env` like the app settings; some
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
    DEMO_TOOLS: bool = setting(True, "Install the demo tools, resources and prompts.")
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
