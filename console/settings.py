"""Settings for the effect console.

Everything that differs between a laptop, CI and production is read from the environment
through the small typed helpers of ``console.environment``. With no environment at all the
console runs on the embedded default: SQLite in ``data/`` and a filesystem Celery broker, so
one command starts everything on a fresh machine.
"""

from __future__ import annotations

import contextlib
import os
from decimal import Decimal
from pathlib import Path
from typing import Any

import dj_database_url

from console.environment import env_bool, env_decimal_map, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent


def create_private_file(path: Path) -> None:
    """Create ``path`` readable and writable by its owner only (0600), if it does not exist,
    and take group and other permissions off an existing one."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    if path.stat().st_mode & 0o077:
        path.chmod(0o600)


# Data folder of the embedded default: the SQLite database, the filesystem broker's queues
# and the sandbox provider's own database all live here.
DATA_DIR = Path(env_str("CONSOLE_DATA_DIR", str(BASE_DIR / "data")))

DEBUG = env_bool("DEBUG", False)
# The default is for development only; its "django-insecure-" prefix makes `check --deploy`
# fail loudly if production ever runs without SECRET_KEY.
# With DEBUG off, console.checks.refuse_known_secrets stops the web process on it.
SECRET_KEY = env_str("SECRET_KEY", "django-insecure-development-key-change-me-in-production-0123456789")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django_htmx",
    "django_fsm",
    "axes",
    "csp",
    "django_otp",
    "django_otp.plugins.otp_totp",
    "console",
    "actions",
    "approvals",
    "harness",
]

MIDDLEWARE = [
    # /healthz and /readyz, answered before host validation and the HTTPS redirect (probes
    # address the process by IP over plain HTTP).
    "console.health.HealthCheckMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Outermost of the console's own: its headers land on every answer, errors included.
    "console.middleware.SecurityHeadersMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Each person's own time zone (console.timezones), for every page after this point.
    "console.timezones.UserTimeZoneMiddleware",
    # Ends sessions older than SESSION_MAX_AGE_SECONDS before any view sees the user.
    "console.middleware.SessionExpiryMiddleware",
    "django_otp.middleware.OTPMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes asks: it turns a lockout raised by the login into its 429 page.
    "axes.middleware.AxesMiddleware",
]
# The demo (`make start`, DEBUG on) shows the console's own 404 page, not Django's URL list.
if DEBUG and env_bool("DEMO_FRIENDLY_404", False):
    MIDDLEWARE.insert(len(MIDDLEWARE) - 1, "console.middleware.FriendlyNotFoundMiddleware")  # before axes

# django-axes checks every login first (lockout), then Django's own model backend.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

ROOT_URLCONF = "console.urls"
WSGI_APPLICATION = "console.wsgi.application"

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
                "console.context_processors.roles",
            ],
            # {% money %} and {% age %} on every page without a {% load %} (see the module).
            "builtins": ["console.templatetags.display"],
        },
    },
]

# --- Database ---------------------------------------------------------------------------
# No DATABASE_URL: SQLite in the data folder (the embedded default). A postgres:// URL uses
# psycopg 3 with its connection pool; CONN_MAX_AGE must stay 0 when the pool is on.
DATABASE_URL = env_str("DATABASE_URL", "")
if DATABASE_URL:
    _db = dj_database_url.parse(DATABASE_URL, conn_max_age=0)
    if _db["ENGINE"] == "django.db.backends.postgresql":
        _db.setdefault("OPTIONS", {})
        if env_bool("DATABASE_POOL", True):
            _db["OPTIONS"]["pool"] = {
                "min_size": env_int("DATABASE_POOL_MIN", 1),
                "max_size": env_int("DATABASE_POOL_MAX", 10),
                "timeout": env_int("DATABASE_POOL_TIMEOUT", 10),
                # Django passes check=ConnectionPool.check_connection itself: a pooled connection
                # is checked before it is handed out, so after a PostgreSQL restart the dead
                # idle connections are replaced instead of failing the next request or task.
            }
        # Server-side parameter binding: psycopg sends the parameters apart from the SQL instead
        # of quoting them into it, and prepares a statement once a connection has run it five
        # times, so the hot paths (claim, record, proposal) skip both the client-side quoting and
        # PostgreSQL's parsing and planning: measured, 8.5 -> 6.9 ms of worker CPU per action in
        # the dispatcher profile. Turn it off behind a pooler that cannot carry prepared
        # statements (PgBouncer before 1.21 in transaction mode).
        _db["OPTIONS"]["server_side_binding"] = env_bool("DATABASE_SERVER_SIDE_BINDING", True)
        _db["TEST"] = {"NAME": env_str("DATABASE_TEST_NAME", "test_console")}
else:
    # The data folder holds the database, the broker's messages and demo tokens: the owner's only.
    DATA_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Created here, before SQLite would create it with the process's umask (usually 0644):
    # the file holds customer names, e-mail addresses and token hashes.
    create_private_file(DATA_DIR / "console.sqlite3")
    _db = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(DATA_DIR / "console.sqlite3"),
        # Several processes (web, worker, beat) share the file: wait for locks instead of
        # failing at once, and take the write lock at BEGIN so SELECT-then-UPDATE cannot
        # deadlock on the lock upgrade.
        "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"},
    }
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-gb"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
# WhiteNoise serves the console's own CSS and htmx straight from the apps' static folders, so
# neither `make start` nor the tests need a collectstatic step; production may still run it.
WHITENOISE_USE_FINDERS = True
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise warns at start-up when it is missing
WHITENOISE_AUTOREFRESH = DEBUG
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"

# --- Login defence and sessions ------------------------------------------------------------
# Production mode: the settings below that differ between a demo and a real deployment. It is
# on unless DEBUG is; `check --deploy` reports what production mode still leaves open.
PRODUCTION_MODE: bool = env_bool("PRODUCTION_MODE", not DEBUG)
# django-axes: after this many failed logins for one username from one IP address, further
# attempts with that username from that address are refused (429) until the cool-off has passed,
# even with the right password. The same username from another address, and another username
# from the same address, are not locked: a guesser cannot lock out a colleague behind the same
# address. Spraying across usernames from one address meets LOGIN_ADDRESS_FAILURE_LIMIT, a
# higher ceiling past which every login from the address waits (console/login_lockout.py).
AXES_FAILURE_LIMIT: int = env_int("LOGIN_FAILURE_LIMIT", 10)
LOGIN_ADDRESS_FAILURE_LIMIT: int = env_int("LOGIN_ADDRESS_FAILURE_LIMIT", 50)
AXES_COOLOFF_TIME: float = env_int("LOGIN_COOLOFF_MINUTES", 15) / 60  # hours
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_HANDLER = "console.login_lockout.LoginLockoutHandler"
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "console/locked_out.html"
# Client address: REMOTE_ADDR, or the proxy's X-Forwarded-For only behind a trusted TLS proxy.
AXES_IPWARE_PROXY_COUNT = 1 if env_bool("BEHIND_TLS_PROXY", False) else None
AXES_IPWARE_META_PRECEDENCE_ORDER = (
    ["HTTP_X_FORWARDED_FOR", "REMOTE_ADDR"] if env_bool("BEHIND_TLS_PROXY", False) else ["REMOTE_ADDR"]
)
# A session ends after this much inactivity, and in any case this long after the login.
SESSION_IDLE_TIMEOUT_SECONDS: int = env_int("SESSION_IDLE_TIMEOUT_SECONDS", 30 * 60)
SESSION_MAX_AGE_SECONDS: int = env_int("SESSION_MAX_AGE_SECONDS", 10 * 3600)
# Idle timeout: the session is saved on every request, so its expiry slides by this much.
SESSION_COOKIE_AGE = SESSION_IDLE_TIMEOUT_SECONDS
SESSION_SAVE_EVERY_REQUEST = True
SESSION_COOKIE_SAMESITE = "Lax"
# Step-up: approving more than this (per currency) needs a TOTP code confirmed within the
# last STEP_UP_MAX_AGE_SECONDS. No entry for a currency means no step-up for it.
STEP_UP_THRESHOLDS: dict[str, Decimal] = env_decimal_map("STEP_UP_THRESHOLDS", "EUR:1000,USD:1000,GBP:800,JPY:150000")
STEP_UP_MAX_AGE_SECONDS: int = env_int("STEP_UP_MAX_AGE_SECONDS", 5 * 60)
OTP_TOTP_ISSUER = "Effect console"
# Admins may create orders by hand only outside production mode: in production, orders come
# from the shop, with a charge the payment provider holds.
ADMIN_MAY_CREATE_ORDERS: bool = env_bool("ADMIN_MAY_CREATE_ORDERS", not PRODUCTION_MODE)

# --- Security (production values come from the environment) ------------------------------
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", False)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("BEHIND_TLS_PROXY", False) else None
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
# Content-Security-Policy (django-csp 4): scripts, styles and everything else from the
# console's own origin only. No inline scripts, no inline styles, no eval: htmx is configured
# to match in base.html (allowEval off, no injected indicator styles) and the page's error
# notices are wired up by console/static/console/console.js instead of hx-on attributes.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "font-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}
# Permissions-Policy: the console uses none of these browser features.
PERMISSIONS_POLICY: str = (
    "accelerometer=(), camera=(), geolocation=(), gyroscope=(), magnetometer=(), microphone=(), "
    "payment=(), usb=(), interest-cohort=()"
)

# --- Celery -------------------------------------------------------------------------------
# The embedded default is kombu's filesystem transport: no server, shared by every process
# on this machine through the data folder. Production and the test suite use Redis.
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {}
if CELERY_BROKER_URL.startswith("filesystem://"):
    _queue_dir = DATA_DIR / "broker"
    (_queue_dir / "queue").mkdir(parents=True, exist_ok=True)
    (_queue_dir / "processed").mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir / "queue"),
        "data_folder_out": str(_queue_dir / "queue"),
        "processed_folder": str(_queue_dir / "processed"),
        "control_folder": str(_queue_dir / "control"),
        "store_processed": False,
    }

# Worker behaviour. Each value is about surviving a crash or a redelivery:
# - acks_late: a task is acknowledged only after it ran, so a worker killed mid-task leaves the
#   message for another worker instead of losing it.
CELERY_TASK_ACKS_LATE = True
# - reject_on_worker_lost: when the process executing a task dies (SIGKILL, OOM), the message
#   is requeued rather than acknowledged as failed. Safe because every task is idempotent: the
#   lease and the conditional UPDATEs decide who may act.
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# - prefetch 1: a worker holds at most one unstarted message, so a killed worker strands at
#   most one message until redelivery, and work spreads evenly over workers.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Results are never read: the database is the record.
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = "console"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# - database connections: Celery's Django fix-up closes them around every task, and in the
#   prefork pool it also closes the whole psycopg pool, so every task opened a new PostgreSQL
#   connection (about 6 ms and 4 extra commits per action). A reuse limit larger than any
#   worker's life turns that off; console.celery returns each task's connections to the
#   process's own pool instead (the pool's check discards a broken one when it is handed out).
#   The fix-up still closes everything a prefork child inherited at fork.
CELERY_DB_REUSE_MAX = 2**62

# --- The console's own limits (each shown in the console where it matters) ---------------
# Currencies the console accepts refunds in.
CONSOLE_CURRENCIES: list[str] = env_list("CONSOLE_CURRENCIES", "EUR,USD,GBP,JPY")
# How many days after payment a refund may still be proposed.
REFUND_WINDOW_DAYS: int = env_int("REFUND_WINDOW_DAYS", 90)
# How long a manager's approval stays valid before the worker must ask again.
APPROVAL_TTL_SECONDS: int = env_int("APPROVAL_TTL_SECONDS", 24 * 3600)
# A manager's rejection takes effect this many seconds after she asks for it; until then she
# may undo it (approvals.services.rejection_request).
REJECTION_UNDO_SECONDS: int = env_int("REJECTION_UNDO_SECONDS", 8)
# How often an open page asks whether an action it shows has moved on (htmx polling).
LIVE_POLL_SECONDS: int = env_int("LIVE_POLL_SECONDS", 2)
# Auto-approval: amounts at or below the currency's threshold are approved by policy.
# AUTO_APPROVAL_ENABLED=0, or no threshold for a currency, switches it off.
AUTO_APPROVAL_ENABLED: bool = env_bool("AUTO_APPROVAL_ENABLED", True)
AUTO_APPROVAL_THRESHOLDS: dict[str, Decimal] = env_decimal_map(
    "AUTO_APPROVAL_THRESHOLDS", "EUR:25,USD:25,GBP:20,JPY:3000"
)
# Caps on autonomy (approvals/caps.py), used where no AutoApprovalCap row in the admin
# overrides them. Past a cap a proposal waits for a manager.
# - per target (order): the total, and the number of actions, auto-approved within the window;
AUTO_APPROVAL_TARGET_MAX_AMOUNTS: dict[str, Decimal] = env_decimal_map(
    "AUTO_APPROVAL_TARGET_MAX_AMOUNTS", "EUR:50,USD:50,GBP:40,JPY:6000"
)
AUTO_APPROVAL_TARGET_MAX_COUNT: int = env_int("AUTO_APPROVAL_TARGET_MAX_COUNT", 2)
AUTO_APPROVAL_TARGET_WINDOW_HOURS: int = env_int("AUTO_APPROVAL_TARGET_WINDOW_HOURS", 7 * 24)
# - per agent: the total auto-approved for its proposals per day, per currency.
AUTO_APPROVAL_AGENT_DAILY_AMOUNTS: dict[str, Decimal] = env_decimal_map(
    "AUTO_APPROVAL_AGENT_DAILY_AMOUNTS", "EUR:250,USD:250,GBP:200,JPY:30000"
)
# SUBMITTING is a lease: only its holder may record the outcome until it expires.
LEASE_SECONDS: int = env_int("LEASE_SECONDS", 60)
# How often beat sweeps AUTHORIZED rows (lost publishes) and expired leases.
SWEEP_INTERVAL_SECONDS: int = env_int("SWEEP_INTERVAL_SECONDS", 10)
# How many AUTHORIZED actions one claim transaction takes (the AUTHORIZED sweep and the
# dispatcher process, actions.engine.dispatcher): one commit for the batch, each action with its
# own lease. The sweep sends its batch one call after another, so it also keeps the batch small
# enough for the last lease to outlast the calls before it (actions.engine.sweeps).
DISPATCH_BATCH_SIZE: int = env_int("DISPATCH_BATCH_SIZE", 16)
# Off where the dispatcher process runs (`manage.py dispatcher`): approvals then publish no
# Celery dispatch per action, the dispatcher claims them from the table (actions.foundation.publish).
DISPATCH_PUBLISH: bool = env_bool("DISPATCH_PUBLISH", True)
# Escalation policy for UNKNOWN actions: this many failed reconciliations within the window
# send the action to NEEDS_REVIEW with a named owner.
RECONCILE_MAX_FAILURES: int = env_int("RECONCILE_MAX_FAILURES", 3)
RECONCILE_WINDOW_SECONDS: int = env_int("RECONCILE_WINDOW_SECONDS", 24 * 3600)
RECONCILE_BASE_BACKOFF_SECONDS: int = env_int("RECONCILE_BASE_BACKOFF_SECONDS", 30)
# Safety margin subtracted from the provider's key retention before a replay is trusted.
KEY_RETENTION_MARGIN_SECONDS: int = env_int("KEY_RETENTION_MARGIN_SECONDS", 3600)
# A receiver that refuses a send without taking it (an SMTP 4xx before DATA) is tried again
# under the same approval; after this many attempts the action goes to a person instead.
NOT_SENT_MAX_ATTEMPTS: int = env_int("NOT_SENT_MAX_ATTEMPTS", 5)
# Escalated actions are due for a decision within this many hours.
REVIEW_DUE_HOURS: int = env_int("REVIEW_DUE_HOURS", 24)
# Review queue: when on, a member of finance may act only on items they own or nobody owns.
REVIEW_OWNERS_ONLY: bool = env_bool("REVIEW_OWNERS_ONLY", False)
# How recent a "not found" lookup must be before finance may retry a refund with the same key.
REVIEW_RETRY_LOOKUP_MAX_AGE_SECONDS: int = env_int("REVIEW_RETRY_LOOKUP_MAX_AGE_SECONDS", 300)
# How often the ledger audit compares the receiver's ledger with the console's records.
LEDGER_AUDIT_INTERVAL_SECONDS: int = env_int("LEDGER_AUDIT_INTERVAL_SECONDS", 3600)
# The audit reads each receiver one window of creation times at a time, so its memory is one
# window's effects, not the receiver's whole history.
LEDGER_AUDIT_WINDOW_SECONDS: int = env_int("LEDGER_AUDIT_WINDOW_SECONDS", 86400)
# Where a kind's first audit starts (ISO 8601, e.g. 2026-01-01T00:00:00+00:00); empty: at the
# kind's earliest action. The first window also takes everything older, so nothing is skipped.
LEDGER_AUDIT_START: str = env_str("LEDGER_AUDIT_START", "")
# Each run reads again this far behind where the last one stopped: an action recorded SUCCEEDED
# by a transaction that committed late, or stamped by a host whose clock runs behind, lands
# behind the cursor. Findings are stored once, whichever run finds them.
LEDGER_AUDIT_OVERLAP_SECONDS: int = env_int("LEDGER_AUDIT_OVERLAP_SECONDS", 600)
# Housekeeping: attempts of actions final for this many days lose their request and response
# bodies (a stub with size and SHA-256 stays); 0 keeps them for ever. Never touches an action
# that is not final, nor any audit event. Beat runs it every HOUSEKEEPING_INTERVAL_SECONDS.
ATTEMPT_BODY_RETENTION_DAYS: int = env_int("ATTEMPT_BODY_RETENTION_DAYS", 90)
HOUSEKEEPING_INTERVAL_SECONDS: int = env_int("HOUSEKEEPING_INTERVAL_SECONDS", 3600)
# Retention and archive, run every RETENTION_INTERVAL_SECONDS: see docs/operators/retention.md
# (closed actions' events are archived; the trail and notifications pruned past their days).
ARCHIVE_AFTER_DAYS: int = env_int("ARCHIVE_AFTER_DAYS", 90)
TRAIL_RETENTION_DAYS: int = env_int("TRAIL_RETENTION_DAYS", 2555)
NOTIFICATION_RETENTION_DAYS: int = env_int("NOTIFICATION_RETENTION_DAYS", 365)
# Daily, though the windows are months and years: each run moves only what left the window since
# the last one, and a daily period stays short of a deploy's restart of beat, which starts its
# intervals over.
RETENTION_INTERVAL_SECONDS: int = env_int("RETENTION_INTERVAL_SECONDS", 24 * 3600)
# Webhooks for agents (actions/agents/webhooks.py). A failed delivery is retried after
# BASE * 2**(n-1) seconds (capped at CAP) until WINDOW seconds after the event; beat sweeps
# deliveries whose publish was lost every SWEEP_INTERVAL_SECONDS.
AGENT_WEBHOOK_BACKOFF_BASE_SECONDS: float = float(env_str("AGENT_WEBHOOK_BACKOFF_BASE_SECONDS", "30"))
AGENT_WEBHOOK_BACKOFF_CAP_SECONDS: float = float(env_str("AGENT_WEBHOOK_BACKOFF_CAP_SECONDS", str(6 * 3600)))
AGENT_WEBHOOK_WINDOW_SECONDS: int = env_int("AGENT_WEBHOOK_WINDOW_SECONDS", 3 * 24 * 3600)
AGENT_WEBHOOK_TIMEOUT_SECONDS: float = float(env_str("AGENT_WEBHOOK_TIMEOUT_SECONDS", "5"))
# Webhooks go to public addresses only (actions.foundation.egress). Loopback is allowed for tests and a
# one-machine demo only; `check --deploy` reports it. An egress proxy, where a deployment has one.
AGENT_WEBHOOK_ALLOW_LOOPBACK: bool = env_bool("AGENT_WEBHOOK_ALLOW_LOOPBACK", False)
AGENT_WEBHOOK_PROXY_URL: str = env_str("AGENT_WEBHOOK_PROXY_URL", "")
# Notifications to people (actions/notifications.py): beat looks for waiting proposals,
# escalations and overdue items this often; mails come from NOTIFICATION_EMAIL_FROM.
NOTIFICATION_INTERVAL_SECONDS: int = env_int("NOTIFICATION_INTERVAL_SECONDS", 60)

# The audit trail's signed checkpoints and check, every TRAIL_INTERVAL_SECONDS (docs/evidence.md).
TRAIL_DEMO_SIGNING_KEY = "demo-trail-signing-key-not-a-secret"
TRAIL_SIGNING_KEY: str = env_str("TRAIL_SIGNING_KEY", TRAIL_DEMO_SIGNING_KEY if DEBUG else "")
TRAIL_CHECKPOINT_LOG = Path(env_str("TRAIL_CHECKPOINT_LOG", str(DATA_DIR / "trail-checkpoints.jsonl")))
TRAIL_INTERVAL_SECONDS: int = env_int("TRAIL_INTERVAL_SECONDS", 3600)
NOTIFICATION_EMAIL_FROM = env_str("NOTIFICATION_EMAIL_FROM", "console@console.invalid")
# The console's address as people reach it (scheme, host, port, no trailing path): the links in
# notification e-mails are this plus the item's path. `make start` sets it from PORT.
CONSOLE_BASE_URL = env_str("CONSOLE_BASE_URL", "http://127.0.0.1:8000")
# A backend of their own: the default EMAIL_BACKEND is the supplier emails' (the mail sandbox,
# whose accepted messages are a receiver's ledger that the audits read; the supplier emails' audit
# skips the messages from NOTIFICATION_EMAIL_FROM). Django's console backend by default;
# `make start` sends them to the mail sandbox by SMTP (EMAIL_HOST, EMAIL_PORT), production to a
# real relay with django.core.mail.backends.smtp.EmailBackend.
NOTIFICATION_EMAIL_BACKEND = env_str("NOTIFICATION_EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
# Django's cache (used by nothing that must be exact: the API's rate counters are a table of
# their own, see actions/api/ratelimit.py).
CACHES = {"default": {"BACKEND": "django.core.cache.backends.db.DatabaseCache", "LOCATION": "console_cache"}}

# The agent API: requests per minute per token (429 with Retry-After past it), requests per
# minute per client address before authentication, and the largest request body accepted
# (413 past it).
API_RATE_LIMIT_PER_MINUTE: int = env_int("API_RATE_LIMIT_PER_MINUTE", 120)
API_ANONYMOUS_RATE_LIMIT_PER_MINUTE: int = env_int("API_ANONYMOUS_RATE_LIMIT_PER_MINUTE", 60)
API_MAX_BODY_BYTES: int = env_int("API_MAX_BODY_BYTES", 64 * 1024)
# Bearer token a metrics scraper must send to /metrics. In production mode /metrics refuses
# every request while it is empty, and `check --deploy` fails (console.checks); outside
# production mode an empty token leaves it open for local scraping.
METRICS_TOKEN: str = env_str("METRICS_TOKEN", "")
# Refund requests: how many one agent may open on one order per day.
REFUND_REQUESTS_PER_ORDER_PER_DAY: int = env_int("REFUND_REQUESTS_PER_ORDER_PER_DAY", 3)
# Fault points in the worker (tests only): comma-separated names; inert when empty.
CONSOLE_FAULT_POINTS: list[str] = env_list("CONSOLE_FAULT_POINTS", "")

# --- Payment provider ---------------------------------------------------------------------
# The same Stripe adapter talks to the sandbox (development, demos, tests) and to Stripe.
PROVIDER_API_BASE: str = env_str("PROVIDER_API_BASE", "http://127.0.0.1:12111")
PROVIDER_API_KEY: str = env_str("PROVIDER_API_KEY", "sk_test_sandbox")
PROVIDER_TIMEOUT_SECONDS: int = env_int("PROVIDER_TIMEOUT_SECONDS", 10)
PROVIDER_KEY_RETENTION_SECONDS: int = env_int("PROVIDER_KEY_RETENTION_SECONDS", 24 * 3600)
PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS: int = env_int("PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS", 2)
# Read the charge before each refund to compare currencies in the console too (one more call per
# refund). Off: the refund request carries the order's currency and the receiver refuses a mismatch.
PROVIDER_VERIFY_CHARGE_CURRENCY: bool = env_bool("PROVIDER_VERIFY_CHARGE_CURRENCY", False)
# Webhooks (POST /webhooks/stripe): the endpoint's signing secret, as the provider shows it
# (whsec_...). The sandbox signs with the same default; production must set its own (the
# default is public: with DEBUG off the console refuses to start on it). Events older than the
# tolerance are refused, so a captured request cannot be replayed later.
PROVIDER_WEBHOOK_SECRET: str = env_str("PROVIDER_WEBHOOK_SECRET", "whsec_sandbox")
PROVIDER_WEBHOOK_TOLERANCE_SECONDS: int = env_int("PROVIDER_WEBHOOK_TOLERANCE_SECONDS", 300)
# A timestamp ahead of this machine's clock by more than this is refused too (clocks drift a
# little; a signature from the future is a replay kept for later).
PROVIDER_WEBHOOK_FUTURE_TOLERANCE_SECONDS: int = env_int("PROVIDER_WEBHOOK_FUTURE_TOLERANCE_SECONDS", 300)
# Bounds checked before an event is parsed: a genuine event is a few kilobytes, nested a
# handful of levels.
PROVIDER_WEBHOOK_MAX_BODY_BYTES: int = env_int("PROVIDER_WEBHOOK_MAX_BODY_BYTES", 512 * 1024)
PROVIDER_WEBHOOK_MAX_DEPTH: int = env_int("PROVIDER_WEBHOOK_MAX_DEPTH", 64)
# --- Accounting system (invoice adjustments) ------------------------------------------------
# A thin client speaks Xero's Accounting API to the accounting sandbox (development, demos,
# tests) or to the real service. Its keys are kept for less time than the payment provider's,
# so reconciliation leans on its lookup by Reference sooner.
ACCOUNTING_API_BASE: str = env_str("ACCOUNTING_API_BASE", "http://127.0.0.1:12112")
ACCOUNTING_ACCESS_TOKEN: str = env_str("ACCOUNTING_ACCESS_TOKEN", "sandbox-access-token")
ACCOUNTING_TENANT_ID: str = env_str("ACCOUNTING_TENANT_ID", "sandbox-tenant")
ACCOUNTING_TIMEOUT_SECONDS: int = env_int("ACCOUNTING_TIMEOUT_SECONDS", 10)
ACCOUNTING_KEY_RETENTION_SECONDS: int = env_int("ACCOUNTING_KEY_RETENTION_SECONDS", 6 * 3600)
ACCOUNTING_LOOKUP_VISIBILITY_DELAY_SECONDS: int = env_int("ACCOUNTING_LOOKUP_VISIBILITY_DELAY_SECONDS", 2)
# Invoice adjustments at or below the currency's threshold are approved by policy (the refund
# thresholds do not apply to them), and no more than the per-bill cap in total on one bill.
INVOICE_ADJUSTMENT_AUTO_APPROVAL_THRESHOLDS: dict[str, Decimal] = env_decimal_map(
    "INVOICE_ADJUSTMENT_AUTO_APPROVAL_THRESHOLDS", "EUR:50,USD:50,GBP:40,JPY:6000"
)
INVOICE_ADJUSTMENT_AUTO_APPROVAL_PER_BILL_CAP: dict[str, Decimal] = env_decimal_map(
    "INVOICE_ADJUSTMENT_AUTO_APPROVAL_PER_BILL_CAP", "EUR:100,USD:100,GBP:80,JPY:12000"
)
# import_charges: the charge's metadata key that names the shop's order number.
CHARGE_ORDER_NUMBER_METADATA_KEY: str = env_str("CHARGE_ORDER_NUMBER_METADATA_KEY", "order_number")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    # The stripe client logs every request at INFO; the attempts table is the record of those.
    "loggers": {"django.db.backends": {"level": "WARNING"}, "stripe": {"level": "WARNING"}},
}

# Time limits shorter than the lease, whatever the lease: a task that overruns is stopped
# before its lease can expire, and the soft limit leaves room to record. (Celery enforces them
# in the prefork pool; the solo workers `make start` runs rely on the provider timeout and the
# lease itself, which is what keeps two holders apart in any case.)
_lease = LEASE_SECONDS
CELERY_TASK_TIME_LIMIT = max(int(_lease * 0.75), 2)
CELERY_TASK_SOFT_TIME_LIMIT = max(int(_lease * 0.6), 1)
# Redis redelivers an unacknowledged message after the visibility timeout. It must be longer
# than the lease (and the task time limit), or a slow but live task would be run twice at once.
if CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": _lease * 5}

# The reconciliation sweep publishes nothing while more than this many messages wait in the
# workers' queue (backpressure: the reconciliations already queued are waiting their turn).
RECONCILE_PUBLISH_MAX_BACKLOG: int = env_int("RECONCILE_PUBLISH_MAX_BACKLOG", 1000)

# Per-receiver rate limits (actions.engine.throttle): a token bucket in front of each receiver,
# so that a burst of approvals never turns into a wave of 429s, each of which would become
# UNKNOWN and a reconciliation. Keys are the receivers' names, values the `limits` library's
# notation. Empty (the default, for the sandboxes and the tests): no limit. Production sets the
# receivers' published limits, for example Stripe's live mode and Xero's per-tenant minute:
#   RECEIVER_RATE_LIMITS="provider=100/second;accounting system=60/minute"
RECEIVER_RATE_LIMITS: dict[str, str] = {
    name.strip(): rate.strip()
    for name, _, rate in (
        entry.partition("=") for entry in env_str("RECEIVER_RATE_LIMITS", "").split(";") if entry.strip()
    )
}
# Where the buckets live: shared by every worker process when the broker is Redis.
RECEIVER_RATE_LIMIT_STORAGE: str = env_str(
    "RECEIVER_RATE_LIMIT_STORAGE",
    CELERY_BROKER_URL if CELERY_BROKER_URL.startswith(("redis://", "rediss://")) else "memory://",
)

# Supplier emails go out through Django's email framework. The default backend is Django's SMTP
# backend, told apart only in that it notes whether the message's content left (so that a 4xx
# before DATA can be told from a drop after it). The embedded default points it at the mail
# sandbox (``python -m harness.sandboxes.mail``); production points it at a real relay, or sets
# EMAIL_BACKEND to an API provider's backend (django-anymail), whose failures are then all
# treated as ambiguous.
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "actions.providers.mail.backend.EmailBackend")
EMAIL_HOST = env_str("EMAIL_HOST", "127.0.0.1")
EMAIL_PORT = env_int("EMAIL_PORT", 12525)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10)
# Who supplier emails come from, and the right-hand side of their Message-ID.
SUPPLIER_EMAIL_FROM = env_str("SUPPLIER_EMAIL_FROM", "accounts-payable@console.invalid")
EMAIL_MESSAGE_ID_DOMAIN = env_str("EMAIL_MESSAGE_ID_DOMAIN", "console.invalid")
# The mail sandbox's control endpoint (its list of accepted messages is the receiver's ledger
# for the audit); `make start` sets it. Empty (a real relay): there is no ledger to read, and
# the audits see no supplier emails.
MAIL_SANDBOX_URL = env_str("MAIL_SANDBOX_URL", "")

# Periodic sweeps: these, not the broker, make the system durable. Each claims rows with
# SELECT ... FOR UPDATE SKIP LOCKED, so any number of beat-driven workers is safe.
# Each entry runs the task actions.tasks.<the name with "_" for "-"> every <interval> seconds.
_PERIODIC_TASKS = {
    "sweep-authorized": SWEEP_INTERVAL_SECONDS,
    "sweep-expired-leases": SWEEP_INTERVAL_SECONDS,
    "sweep-reconcile": SWEEP_INTERVAL_SECONDS,
    "sweep-workflows": SWEEP_INTERVAL_SECONDS,
    "ledger-audit": LEDGER_AUDIT_INTERVAL_SECONDS,
    # Pending rejections whose undo window passed but whose own task was lost.
    "sweep-rejections": SWEEP_INTERVAL_SECONDS,
    # Agent webhooks whose publish was lost, or whose retry is due (actions.agents.webhooks).
    "sweep-agent-webhooks": SWEEP_INTERVAL_SECONDS,
    # Notifications: waiting proposals, escalations and overdue items (actions.notifications).
    "notify-people": NOTIFICATION_INTERVAL_SECONDS,
    # The audit trail's signed checkpoints and its check (actions.evidence).
    "trail-checkpoint": TRAIL_INTERVAL_SECONDS,
    "trail-verify": TRAIL_INTERVAL_SECONDS,
    # Storage tidying, not durability (actions.engine.housekeeping).
    "housekeeping-prune-attempt-bodies": HOUSEKEEPING_INTERVAL_SECONDS,
    # The archive of closed actions and the prunings past retention (actions.engine.retention).
    "retention-archive": RETENTION_INTERVAL_SECONDS,
}
CELERY_BEAT_SCHEDULE: dict[str, dict[str, Any]] = {
    name: {"task": "actions.tasks." + name.replace("-", "_"), "schedule": float(interval)}
    for name, interval in _PERIODIC_TASKS.items()
}
# A periodic task that has not finished for this many of its own intervals is stale: /readyz
# says so and the metrics' console_schedule_stale is 1 (alert on it; console/deploy).
SCHEDULE_STALE_PERIODS: int = env_int("SCHEDULE_STALE_PERIODS", 3)
# A periodic task that waited in the queue as long as its stale threshold is superseded: it
# expires and the worker discards it instead of running it, so that a queue whose worker was
# down does not run an hour of sweeps when it comes back. Not sooner: each host's periodic
# worker runs the sweeps one after another, so a copy waits behind a long sweep for about an
# interval, and one that expired there was never run (each beat's tick sends them all at
# once). A late copy still does its period's work: it claims the period the database is in
# when it starts.
for _entry in CELERY_BEAT_SCHEDULE.values():
    _entry.setdefault("options", {"expires": _entry["schedule"] * SCHEDULE_STALE_PERIODS})
    # Every host runs beat; the task claims its period first and runs once per period, on one
    # host only (actions.foundation.schedule).
    _entry.setdefault("kwargs", {"scheduled": True})
# The periodic tasks wait in a queue of their own, with a worker of its own, not behind the
# dispatch backlog they exist to clear (there they went stale under load, or expired unrun).
PERIODIC_QUEUE = "periodic"
CELERY_TASK_ROUTES = {entry["task"]: {"queue": PERIODIC_QUEUE} for entry in CELERY_BEAT_SCHEDULE.values()}
