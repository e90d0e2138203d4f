"""Django settings for mcptasks.

Every value comes from the environment (through django-environ) in this one module.
With nothing set, the embedded default runs: SQLite in WAL mode, the in-memory channel
layer and the local-memory cache. ``DATABASE_URL=postgres://...`` and ``REDIS_URL=redis://...``
switch to PostgreSQL (psycopg 3), channels-redis and the Redis cache.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import environ
from django.core.exceptions import ImproperlyConfigured

from mcptasks.conf import AppSettings, DeploymentSettings, deployment
from mcptasks.db.config import pg_connection_options
from mcptasks.observability import logs as observability_logs
from tenants.conf import TenantSettings
from tenants.infra.typed_settings import read_env
from tenants.kv import keepalive_options

BASE_DIR = Path(__file__).resolve().parent.parent

# Every variable is defined once (type, default, meaning) in mcptasks/conf.py and
# tenants/conf.py; docs/settings.md is generated from those definitions. A file named by
# MCPTASKS_ENV_FILE (never implicitly) may provide the variables: read it before the rest.
_deploy = deployment(read_env(DeploymentSettings))
if _deploy.ENV_FILE:
    environ.Env.read_env(_deploy.ENV_FILE)
    _deploy = deployment(read_env(DeploymentSettings))

DEBUG = _deploy.DEBUG
# The development key only ever signs local cookies/cursors; production must set SECRET_KEY
# (system check mcptasks.W001 warns otherwise).
SECRET_KEY = _deploy.SECRET_KEY
# Encrypts secrets at rest (external issuers' shared secrets); see tenants/crypto.py.
SECRETS_KEY = _deploy.SECRETS_KEY
# Keys the audit chains' HMACs; see mcptasks/audit/trail.py.
AUDIT_KEY = _deploy.AUDIT_KEY
ALLOWED_HOSTS: list[str] = list(_deploy.ALLOWED_HOSTS)

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "oauth2_provider",
    "channels",
    "tenants",
    "mcptasks",
]
if _deploy.DEMO_TOOLS:
    INSTALLED_APPS.append("mcptasks.demo")
if _deploy.CONFORMANCE_FIXTURES:
    INSTALLED_APPS.append("mcptasks.conformance")
# Extra apps whose tools.py should be loaded (e.g. a deployment's own tool package).
INSTALLED_APPS += list(_deploy.EXTRA_APPS)

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Static files (the admin's CSS/JS, the dashboard's vendored charts) under every ASGI server.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "mcptasks.urls"
ASGI_APPLICATION = "mcptasks.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

VAR_DIR = Path(_deploy.VAR_DIR or BASE_DIR / "var")
_app = AppSettings(**read_env(AppSettings))
# An empty DATABASE_URL (``DATABASE_URL= cmd``) means "unset", the embedded default.
DATABASES: dict[str, Any] = {
    "default": environ.Env.db_url_config(_deploy.DATABASE_URL or f"sqlite:///{VAR_DIR / 'mcptasks.sqlite3'}"),
}
_db = DATABASES["default"]
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # The embedded default keeps its database under VAR_DIR; make sure the folder exists.
    if _db["NAME"] != ":memory:":
        Path(_db["NAME"]).parent.mkdir(parents=True, exist_ok=True)
    # WAL lets readers proceed while a writer commits; IMMEDIATE transactions take the write
    # lock up front so two writers never deadlock on a lock upgrade.
    _db.setdefault("OPTIONS", {}).update(
        {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=10000;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        }
    )
    _db.setdefault("TEST", {})
    if _deploy.TEST_SQLITE_FILE:
        _db["TEST"]["NAME"] = _deploy.TEST_SQLITE_FILE
elif _db["ENGINE"].startswith("django.db.backends.postgresql"):
    # Persistent connections (health-checked before reuse): a new PostgreSQL connection per
    # request was the largest single cost of the request path.
    _db.setdefault("CONN_MAX_AGE", _deploy.CONN_MAX_AGE)
    _db.setdefault("CONN_HEALTH_CHECKS", True)
    _db.setdefault("OPTIONS", {}).update(pg_connection_options(_app))
    if _app.DB_POOLER == "transaction":
        # A transaction pooler hands each transaction to any server connection: no WITH HOLD
        # cursors (``.iterator()`` fetches client-side instead), no named prepared statements,
        # and the timeouts are set per transaction by the backend (startup options would be
        # refused by PgBouncer, and a plain SET would leak to other clients).
        _db["DISABLE_SERVER_SIDE_CURSORS"] = True
        _db["ENGINE"] = "mcptasks.db.pooled_postgresql"

REDIS_URL = _deploy.REDIS_URL
CHANNEL_PREFIX = _deploy.CHANNEL_PREFIX
# App settings: every MCPTASKS_<NAME> that is set, read once; the typed views below (defaults
# from the definitions) configure the channel layer and the built-in AS.
MCPTASKS = read_env(AppSettings)
TENANTS = read_env(TenantSettings)
_LAYER = AppSettings(**MCPTASKS)
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # channels-redis with a bounded, blocking pool (see mcptasks/streams/layers.py).
            "BACKEND": "mcptasks.streams.layers.RedisChannelLayer",
            "CONFIG": {
                "hosts": [
                    {
                        "address": REDIS_URL,
                        # Above the layer's 5 s blocking read, or every quiet stream fails.
                        "socket_timeout": _LAYER.REDIS_SOCKET_TIMEOUT_S,
                        "socket_connect_timeout": _LAYER.REDIS_CONNECT_TIMEOUT_S,
                        **keepalive_options(),
                        "health_check_interval": _LAYER.REDIS_HEALTH_CHECK_S,
                    }
                ],
                "prefix": f"{CHANNEL_PREFIX}:layer:",
                "capacity": 1000,
                "expiry": 60,
                "group_expiry": 86400,
                "pool_size": _LAYER.REDIS_LAYER_POOL_SIZE,
                "pool_timeout": _LAYER.REDIS_LAYER_POOL_TIMEOUT_S,
            },
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
# Django's cache holds only per-process things (JWKS documents). Shared counters (rate limits,
# poll notes) use the process-wide Redis client of tenants.kv: Django's Redis cache client is
# rebuilt per async context and keeps its connections open, one leaked connection per request.
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "mcptasks"}}

AUTH_PASSWORD_VALIDATORS: list[dict[str, str]] = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# Django 6 behaviour now: URL form fields assume https.
FORMS_URLFIELD_ASSUME_HTTPS = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
# WhiteNoise serves STATIC_ROOT (``manage.py collectstatic``, compressed copies included) and,
# through the finders, each app's static folder, so a fresh clone is styled without a build step.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True
# WhiteNoise warns about a missing STATIC_ROOT; before the first collectstatic it is empty.
with contextlib.suppress(OSError):
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

if _deploy.LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured(f"MCPTASKS_LOG_FORMAT must be plain or json, not {_deploy.LOG_FORMAT[:40]!r}")
# JSON lines carry the request/task context the pipeline binds (mcptasks/observability/logs.py).
observability_logs.JSON_LOGS = _deploy.LOG_FORMAT == "json"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "mcptasks.observability.JsonFormatter"},
    },
    "filters": {"client_errors_without_traceback": {"()": "mcptasks.hardening.ClientErrorsWithoutTraceback"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": _deploy.LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": _deploy.LOG_LEVEL},
    "loggers": {
        "daphne": {"level": "WARNING"},
        "django.channels.server": {"level": "WARNING"},
        # On the logger itself, so every handler (and Django's own) sees the stripped record.
        "django.request": {"filters": ["client_errors_without_traceback"]},
    },
}

_PUBLIC_URL = TenantSettings(**TENANTS).PUBLIC_URL

# --- TLS and cookies (docs/operations.md, "Running behind a TLS proxy") ---
# Secure by default outside DEBUG (conf.DEBUG_DEFAULTS); `manage.py serve` (plain-HTTP
# development) turns them off.
SESSION_COOKIE_SECURE = _deploy.SESSION_COOKIE_SECURE
CSRF_COOKIE_SECURE = _deploy.CSRF_COOKIE_SECURE
SESSION_COOKIE_AGE = _deploy.SESSION_COOKIE_AGE
SECURE_HSTS_SECONDS = _deploy.SECURE_HSTS_SECONDS
SECURE_HSTS_INCLUDE_SUBDOMAINS = _deploy.SECURE_HSTS_INCLUDE_SUBDOMAINS
SECURE_HSTS_PRELOAD = _deploy.SECURE_HSTS_PRELOAD
SECURE_SSL_REDIRECT = _deploy.SECURE_SSL_REDIRECT
# Internal probes and scrapers reach these over plain HTTP on the private network.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_" + _deploy.SECURE_PROXY_SSL_HEADER.strip().upper().replace("-", "_"), "https")
    if _deploy.SECURE_PROXY_SSL_HEADER.strip()
    else None
)
CSRF_TRUSTED_ORIGINS: list[str] = list(_deploy.CSRF_TRUSTED_ORIGINS)
if _PUBLIC_URL:
    _origin = "{0.scheme}://{0.netloc}".format(urlsplit(_PUBLIC_URL))
    if _origin not in CSRF_TRUSTED_ORIGINS:
        CSRF_TRUSTED_ORIGINS.append(_origin)
OAUTH2_PROVIDER = {
    # Scopes bounded by operator grants per application and membership (tenants/oauth.py).
    "OAUTH2_VALIDATOR_CLASS": "tenants.oauth.TenantOAuth2Validator",
    "SCOPES": {
        "mcp:tools": "Call MCP tools",
        "mcp:tasks": "Create and read MCP tasks",
        "mcp:tasks:tenant": "See every task of the tenant",
        # The audit-review API, for an auditor's or tenant admin's application (mcptasks/console/api_auth.py).
        "audit:read": "Read the tenant's audit events and tasks (audit-review API)",
    },
    "DEFAULT_SCOPES": ["mcp:tools", "mcp:tasks"],
    "PKCE_REQUIRED": True,
    "ACCESS_TOKEN_EXPIRE_SECONDS": _deploy.ACCESS_TOKEN_EXPIRE_S,
    # RFC 9700: keep only the SHA-256 checksum of access/refresh tokens at rest (the token
    # column stays blank), S256-only PKCE, no implicit/password grants, bearer in header only.
    "COMPLIANT_BCP_RFC9700_TOKEN_STORAGE": True,
    "COMPLIANT_BCP_RFC9700_PKCE_METHOD": True,
    "COMPLIANT_BCP_RFC9700_IMPLICIT_GRANT": True,
    "COMPLIANT_BCP_RFC9700_PASSWORD_GRANT": True,
    "COMPLIANT_BCP_RFC9700_ACCESS_TOKEN_TRANSPORT": True,
    "COMPLIANT_BCP_RFC9700_AUTHZ_RESPONSE_ISS": True,
    "ROTATE_REFRESH_TOKEN": True,
    "REFRESH_TOKEN_REUSE_PROTECTION": True,
    "OAUTH2_GRANT_TYPES_SUPPORTED": ["authorization_code", "client_credentials", "refresh_token"],
    "OAUTH2_RESPONSE_TYPES_SUPPORTED": ["code"],
    # Issuer of the built-in AS: the origin of MCPTASKS_PUBLIC_URL when set, else per request.
    "OIDC_ISS_ENDPOINT": "{0.scheme}://{0.netloc}".format(urlsplit(_PUBLIC_URL)) if _PUBLIC_URL else "",
    "ALLOWED_REDIRECT_URI_SCHEMES": ["http", "https"] if _deploy.OAUTH_HTTP_REDIRECTS else ["https"],
}
LOGIN_URL = "/accounts/login/"

# The audit-review API (mcptasks/console/api*.py): operators' credentials, read-only, OpenAPI described.
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # OAuth bearer tokens with the audit:read scope from the built-in authorization server;
        # first, so that a missing or bad credential is a 401 with a Bearer challenge.
        "mcptasks.console.api_auth.AuditTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
        # HTTP Basic, with the sign-in pages' failed-password budgets (mcptasks/console/api_auth.py).
        "mcptasks.console.api_auth.ThrottledBasicAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # Counted in Redis across processes (Django's cache here is per process).
    "DEFAULT_THROTTLE_CLASSES": ["mcptasks.console.api_auth.SharedUserRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"user": "600/min"},
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "mcptasks audit review API",
    "DESCRIPTION": "A tenant's audit events and tasks, for its auditors and tenant admins.",
    "VERSION": "1",
    "SCHEMA_PATH_PREFIX": "/api/",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI from drf-spectacular-sidecar: no CDN, works offline.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- tenants app (Tenants and OAuth; typed defaults in tenants/conf.py) ---
# Named explicitly so migrations that point at DOT's (swappable) application model resolve.
OAUTH2_PROVIDER_APPLICATION_MODEL = "oauth2_provider.Application"
