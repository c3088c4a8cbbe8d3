#!/usr/bin/env bash
# Start the whole console on the embedded default: SQLite and a filesystem broker in data/,
# the sandbox payment provider, the mail sandbox, a Celery worker, the periodic tasks' worker and
# beat, and the web server.
# Seeds demo data.
# Ctrl-C stops everything.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$REPO_ROOT"

ensure_venv "$REPO_ROOT/requirements.txt"

export DEBUG="${DEBUG:-1}"
# The console's own "Not found" page, not Django's DEBUG list of URL patterns.
export DEMO_FRIENDLY_404="${DEMO_FRIENDLY_404:-1}"
export CONSOLE_DATA_DIR="${CONSOLE_DATA_DIR:-$REPO_ROOT/data}"
PORT="${PORT:-8000}"
MCP_PORT="${MCP_PORT:-8001}"
SANDBOX_PORT="${SANDBOX_PORT:-12111}"
export PROVIDER_API_BASE="${PROVIDER_API_BASE:-http://127.0.0.1:$SANDBOX_PORT}"
ACCOUNTING_SANDBOX_PORT="${ACCOUNTING_SANDBOX_PORT:-12112}"
export ACCOUNTING_API_BASE="${ACCOUNTING_API_BASE:-http://127.0.0.1:$ACCOUNTING_SANDBOX_PORT}"
mkdir -p "$CONSOLE_DATA_DIR/logs"

pids=()
stop_all() {
    trap - EXIT INT TERM
    echo
    echo "==> stopping"
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap stop_all EXIT INT TERM

echo "==> sandbox provider on $PROVIDER_API_BASE (log: $CONSOLE_DATA_DIR/logs/sandbox.log)"
start_sandbox "$PROVIDER_API_BASE/_sandbox/health" "$CONSOLE_DATA_DIR/logs/sandbox.log" \
    harness.sandboxes.payment --host 127.0.0.1 --port "$SANDBOX_PORT" --db "$CONSOLE_DATA_DIR/sandbox.sqlite3"

MAIL_SMTP_PORT="${MAIL_SMTP_PORT:-12525}"
MAIL_HTTP_PORT="${MAIL_HTTP_PORT:-12580}"
export EMAIL_HOST="${EMAIL_HOST:-127.0.0.1}" EMAIL_PORT="${EMAIL_PORT:-$MAIL_SMTP_PORT}"
export MAIL_SANDBOX_URL="${MAIL_SANDBOX_URL:-http://127.0.0.1:$MAIL_HTTP_PORT}"
# Notifications to people go to the same sandbox by SMTP, with links to this console.
export NOTIFICATION_EMAIL_BACKEND="${NOTIFICATION_EMAIL_BACKEND:-django.core.mail.backends.smtp.EmailBackend}"
export CONSOLE_BASE_URL="${CONSOLE_BASE_URL:-http://127.0.0.1:$PORT}"
echo "==> mail sandbox: SMTP on 127.0.0.1:$MAIL_SMTP_PORT, its inbox on $MAIL_SANDBOX_URL/ (JSON: $MAIL_SANDBOX_URL/messages)"
start_sandbox "$MAIL_SANDBOX_URL/health" "$CONSOLE_DATA_DIR/logs/mail-sandbox.log" \
    harness.sandboxes.mail --host 127.0.0.1 --smtp-port "$MAIL_SMTP_PORT" --http-port "$MAIL_HTTP_PORT" \
    --db "$CONSOLE_DATA_DIR/mail-sandbox.sqlite3"

echo "==> accounting sandbox on $ACCOUNTING_API_BASE (log: $CONSOLE_DATA_DIR/logs/accounting-sandbox.log)"
start_sandbox "$ACCOUNTING_API_BASE/_sandbox/health" "$CONSOLE_DATA_DIR/logs/accounting-sandbox.log" \
    harness.sandboxes.accounting --host 127.0.0.1 --port "$ACCOUNTING_SANDBOX_PORT" \
    --db "$CONSOLE_DATA_DIR/accounting-sandbox.sqlite3"

echo "==> database"
"$PY" manage.py migrate --noinput >/dev/null
"$PY" manage.py createcachetable
"$PY" manage.py seed_demo

echo "==> workers and beat (logs in $CONSOLE_DATA_DIR/logs/)"
"$PY" -m celery -A console worker --pool solo --loglevel INFO --hostname "worker@%h" \
    >"$CONSOLE_DATA_DIR/logs/worker.log" 2>&1 &
pids+=($!)
# The periodic tasks' own worker (settings.PERIODIC_QUEUE): the sweeps never wait behind the
# dispatches queued for the worker above.
"$PY" -m celery -A console worker --pool solo --queues periodic --loglevel INFO --hostname "periodic@%h" \
    >"$CONSOLE_DATA_DIR/logs/periodic-worker.log" 2>&1 &
pids+=($!)
"$PY" -m celery -A console beat --loglevel INFO --schedule "$CONSOLE_DATA_DIR/celerybeat-schedule" \
    >"$CONSOLE_DATA_DIR/logs/beat.log" 2>&1 &
pids+=($!)

echo "==> MCP server for agents on http://127.0.0.1:$MCP_PORT/mcp (log: $CONSOLE_DATA_DIR/logs/mcp.log)"
"$PY" manage.py mcp_serve --port "$MCP_PORT" >"$CONSOLE_DATA_DIR/logs/mcp.log" 2>&1 &
pids+=($!)

echo "==> console on http://127.0.0.1:$PORT/  (maria / fiona / alex / adam, password demo-password)"
"$PY" manage.py runserver "127.0.0.1:$PORT" &
pids+=($!)
wait -n "${pids[@]}"
