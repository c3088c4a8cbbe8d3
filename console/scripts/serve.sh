#!/usr/bin/env bash
# The production profile, locally: gunicorn (console/gunicorn_conf.py), a Celery worker (prefork),
# the periodic tasks' worker and Celery beat, on PostgreSQL and Redis (started here if they are down, as test.sh does).
# DEBUG is off. Without PROVIDER_API_BASE the sandbox provider is started as the payment
# provider. Ctrl-C stops everything this script started.
#
# Settings come from the environment, as in production (console/deploy/console.env lists them).
# Defaults: database "console" (SERVE_DB_NAME) on the local PostgreSQL, created if missing, Redis database 1,
# data folder data/serve/, port 8000.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$REPO_ROOT"

ensure_venv "$REPO_ROOT/requirements.txt"
ensure_postgres
ensure_redis

export DEBUG=0
export CONSOLE_DATA_DIR="${CONSOLE_DATA_DIR:-$REPO_ROOT/data/serve}"
mkdir -p "$CONSOLE_DATA_DIR/logs"
if [ -z "${DATABASE_URL:-}" ]; then
    SERVE_DB_NAME="${SERVE_DB_NAME:-console}"
    export DATABASE_URL="postgres://postgres@127.0.0.1:5432/$SERVE_DB_NAME"
    if ! psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$SERVE_DB_NAME'" | grep -q 1; then
        echo "==> creating the PostgreSQL database '$SERVE_DB_NAME'"
        createdb -h 127.0.0.1 -U postgres "$SERVE_DB_NAME"
    fi
fi
export CELERY_BROKER_URL="${CELERY_BROKER_URL:-redis://127.0.0.1:6379/1}"
# A secret key of this machine's own, kept in the data folder, unless one is given: sessions
# survive a restart, and no key is ever committed.
if [ -z "${SECRET_KEY:-}" ]; then
    SECRET_KEY="$(kept_secret "$CONSOLE_DATA_DIR/secret_key" "secrets.token_urlsafe(50)")"
    export SECRET_KEY
fi
# The same for the provider's webhook secret: the console refuses to start on the sandbox's
# public one with DEBUG off. The sandbox started below signs its events with it.
if [ -z "${PROVIDER_WEBHOOK_SECRET:-}" ]; then
    PROVIDER_WEBHOOK_SECRET="$(kept_secret "$CONSOLE_DATA_DIR/provider_webhook_secret" "'whsec_' + secrets.token_urlsafe(32)")"
    export PROVIDER_WEBHOOK_SECRET
fi
export SANDBOX_WEBHOOK_SECRET="${SANDBOX_WEBHOOK_SECRET:-$PROVIDER_WEBHOOK_SECRET}"
PORT="${PORT:-8000}"
export GUNICORN_BIND="${GUNICORN_BIND:-127.0.0.1:$PORT}"

pids=()
stop_all() {
    trap - EXIT INT TERM
    echo
    echo "==> stopping"
    # TERM first: gunicorn and the worker finish what they are doing (graceful_timeout).
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap stop_all EXIT INT TERM

if [ -z "${PROVIDER_API_BASE:-}" ]; then
    SANDBOX_PORT="${SANDBOX_PORT:-12111}"
    export PROVIDER_API_BASE="http://127.0.0.1:$SANDBOX_PORT"
    echo "==> sandbox provider on $PROVIDER_API_BASE (log: $CONSOLE_DATA_DIR/logs/sandbox.log)"
    "$PY" -m harness.sandboxes.payment --host 127.0.0.1 --port "$SANDBOX_PORT" \
        --db "$CONSOLE_DATA_DIR/sandbox.sqlite3" >"$CONSOLE_DATA_DIR/logs/sandbox.log" 2>&1 &
    pids+=($!)
fi

echo "==> database migrations"
"$PY" manage.py migrate --noinput >/dev/null
"$PY" manage.py createcachetable

echo "==> workers and beat (logs in $CONSOLE_DATA_DIR/logs/)"
"$PY" -m celery -A console worker --concurrency "${WORKER_CONCURRENCY:-2}" --loglevel INFO \
    --hostname "worker@%h" >"$CONSOLE_DATA_DIR/logs/worker.log" 2>&1 &
pids+=($!)
# The periodic tasks' own worker (settings.PERIODIC_QUEUE), one process: the sweeps never wait
# behind the dispatch backlog, and a sweep at a time is all the schedule asks for.
"$PY" -m celery -A console worker --queues periodic --concurrency 1 --loglevel INFO \
    --hostname "periodic@%h" >"$CONSOLE_DATA_DIR/logs/periodic-worker.log" 2>&1 &
pids+=($!)
"$PY" -m celery -A console beat --loglevel INFO --schedule "$CONSOLE_DATA_DIR/celerybeat-schedule" \
    >"$CONSOLE_DATA_DIR/logs/beat.log" 2>&1 &
pids+=($!)

echo "==> gunicorn on http://$GUNICORN_BIND/ (access log below, one JSON line per request)"
"$VENV/bin/gunicorn" -c console/gunicorn_conf.py &
pids+=($!)

for _ in $(seq 1 120); do
    if curl -fsS "http://$GUNICORN_BIND/readyz" >/dev/null 2>&1; then break; fi
    sleep 0.5
done
echo "==> /readyz: $(curl -sS "http://$GUNICORN_BIND/readyz" || echo 'no answer')"
echo "==> users: manage.py create_user NAME --role ROLE; agents: manage.py create_agent NAME --scopes refund"
wait -n "${pids[@]}"
