"""Settings for the effect console.

Everything that differs between a laptop, CI and production is read from the environment
through the small typed helpers below. With no environment at all the console runs on the
embedded default: SQLite in ``data/`` and a filesystem Celery broker, so one command starts
everything on a fresh machine.
"""

from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw not in (None, "") else default


def env_decimal_map(name: str, default: str) -> dict[str, Decimal]:
    """Parse ``"EUR:50,USD:50"`` into ``{"EUR": Decimal("50"), ...}``."""
    raw = os.environ.get(name, default)
    result: dict[str, Decimal] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        currency, _, amount = item.partition(":")
        result[currency.strip().upper()] = Decimal(amount.strip())
    return result


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in env_str(name, default).split(",") if item.strip()]


# Data folder of the embedded default: the SQLite database, the filesystem broker's queues
# and the sandbox provider's own database all live here.
DATA_DIR = Path(env_str("CONSOLE_DATA_DIR", str(BASE_DIR / "data")))

DEBUG = env_bool("DEBUG", False)
# The default is for development only; its "django-insecure-" prefix makes `check --deploy`
# fail loudly if production ever runs without SECRET_KEY.
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
    "console",
    "actions",
    "approvals",
]

MIDDLEWARE = [
    # /healthz and /readyz, answered before host validation and the HTTPS redirect (probes
    # address the process by IP over plain HTTP).
    "console.health.HealthCheckMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
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
        _db["TEST"] = {"NAME": env_str("DATABASE_TEST_NAME", "test_console")}
else:
    DATA_DIR.mkdir(parents=True, exist_ok=True)
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

# --- The console's own limits (each shown in the console where it matters) ---------------
# Currencies the console accepts refunds in.
CONSOLE_CURRENCIES: list[str] = env_list("CONSOLE_CURRENCIES", "EUR,USD,GBP,JPY")
# How many days after payment a refund may still be proposed.
REFUND_WINDOW_DAYS: int = env_int("REFUND_WINDOW_DAYS", 90)
# How long a manager's approval stays valid before the worker must ask again.
APPROVAL_TTL_SECONDS: int = env_int("APPROVAL_TTL_SECONDS", 24 * 3600)
# Auto-approval: amounts at or below the currency's threshold are approved by policy.
# AUTO_APPROVAL_ENABLED=0, or no threshold for a currency, switches it off.
AUTO_APPROVAL_ENABLED: bool = env_bool("AUTO_APPROVAL_ENABLED", True)
AUTO_APPROVAL_THRESHOLDS: dict[str, Decimal] = env_decimal_map(
    "AUTO_APPROVAL_THRESHOLDS", "EUR:25,USD:25,GBP:20,JPY:3000"
)
# SUBMITTING is a lease: only its holder may record the outcome until it expires.
LEASE_SECONDS: int = env_int("LEASE_SECONDS", 60)
# How often beat sweeps AUTHORIZED rows (lost publishes) and expired leases.
SWEEP_INTERVAL_SECONDS: int = env_int("SWEEP_INTERVAL_SECONDS", 10)
# Escalation policy for UNKNOWN actions: this many failed reconciliations within the window
# send the action to NEEDS_REVIEW with a named owner.
RECONCILE_MAX_FAILURES: int = env_int("RECONCILE_MAX_FAILURES", 3)
RECONCILE_WINDOW_SECONDS: int = env_int("RECONCILE_WINDOW_SECONDS", 24 * 3600)
RECONCILE_BASE_BACKOFF_SECONDS: int = env_int("RECONCILE_BASE_BACKOFF_SECONDS", 30)
# Safety margin subtracted from the provider's key retention before a replay is trusted.
KEY_RETENTION_MARGIN_SECONDS: int = env_int("KEY_RETENTION_MARGIN_SECONDS", 3600)
# Escalated actions are due for a decision within this many hours.
REVIEW_DUE_HOURS: int = env_int("REVIEW_DUE_HOURS", 24)
# Review queue: when on, a member of finance may act only on items they own or nobody owns.
REVIEW_OWNERS_ONLY: bool = env_bool("REVIEW_OWNERS_ONLY", False)
# How recent a "not found" lookup must be before finance may retry a refund with the same key.
REVIEW_RETRY_LOOKUP_MAX_AGE_SECONDS: int = env_int("REVIEW_RETRY_LOOKUP_MAX_AGE_SECONDS", 300)
# How often the ledger audit compares the receiver's ledger with the console's records.
LEDGER_AUDIT_INTERVAL_SECONDS: int = env_int("LEDGER_AUDIT_INTERVAL_SECONDS", 3600)
# Housekeeping: attempts of actions final for this many days lose their request and response
# bodies (a stub with size and SHA-256 stays); 0 keeps them for ever. Never touches an action
# that is not final, nor any audit event. Beat runs it every HOUSEKEEPING_INTERVAL_SECONDS.
ATTEMPT_BODY_RETENTION_DAYS: int = env_int("ATTEMPT_BODY_RETENTION_DAYS", 90)
HOUSEKEEPING_INTERVAL_SECONDS: int = env_int("HOUSEKEEPING_INTERVAL_SECONDS", 3600)
# The API's per-token rate counters live in this cache, which every web process must share.
# The database cache works on SQLite and PostgreSQL alike and stays out of the transactions
# that record actions; its increment is a read then a write, so a parallel burst from one
# token can pass a few requests over the limit (Redis's cache would be exact).
CACHES = {"default": {"BACKEND": "django.core.cache.backends.db.DatabaseCache", "LOCATION": "console_cache"}}

# The agent API: requests per minute per token (429 with Retry-After past it), and the largest
# request body accepted (413 past it).
API_RATE_LIMIT_PER_MINUTE: int = env_int("API_RATE_LIMIT_PER_MINUTE", 120)
API_MAX_BODY_BYTES: int = env_int("API_MAX_BODY_BYTES", 64 * 1024)
# Bearer token a metrics scraper must send to /metrics; empty leaves the endpoint open
# (it shows counts and ages only, no customer data).
METRICS_TOKEN: str = env_str("METRICS_TOKEN", "")
# Fault points in the worker (tests only): comma-separated names; inert when empty.
CONSOLE_FAULT_POINTS: list[str] = env_list("CONSOLE_FAULT_POINTS", "")

# --- Payment provider ---------------------------------------------------------------------
# The same Stripe adapter talks to the sandbox (development, demos, tests) and to Stripe.
PROVIDER_API_BASE: str = env_str("PROVIDER_API_BASE", "http://127.0.0.1:12111")
PROVIDER_API_KEY: str = env_str("PROVIDER_API_KEY", "sk_test_sandbox")
PROVIDER_TIMEOUT_SECONDS: int = env_int("PROVIDER_TIMEOUT_SECONDS", 10)
PROVIDER_KEY_RETENTION_SECONDS: int = env_int("PROVIDER_KEY_RETENTION_SECONDS", 24 * 3600)
PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS: int = env_int("PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS", 2)
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

# Periodic sweeps: these, not the broker, make the system durable. Each claims rows with
# SELECT ... FOR UPDATE SKIP LOCKED, so any number of beat-driven workers is safe.
CELERY_BEAT_SCHEDULE = {
    "sweep-authorized": {
        "task": "actions.tasks.sweep_authorized",
        "schedule": float(SWEEP_INTERVAL_SECONDS),
    },
    "sweep-expired-leases": {
        "task": "actions.tasks.sweep_expired_leases",
        "schedule": float(SWEEP_INTERVAL_SECONDS),
    },
    "sweep-reconcile": {
        "task": "actions.tasks.sweep_reconcile",
        "schedule": float(SWEEP_INTERVAL_SECONDS),
    },
    "ledger-audit": {
        "task": "actions.tasks.ledger_audit",
        "schedule": float(LEDGER_AUDIT_INTERVAL_SECONDS),
    },
    # Storage tidying, not durability (actions.housekeeping).
    "housekeeping-prune-attempt-bodies": {
        "task": "actions.tasks.housekeeping_prune_attempt_bodies",
        "schedule": float(HOUSEKEEPING_INTERVAL_SECONDS),
    },
}
