#!/usr/bin/env bash
# The whole test suite, against PostgreSQL and Redis (started here if they are down).
# Extra arguments go to pytest, e.g. `make test ARGS="-k reservation"`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$REPO_ROOT"

ensure_venv "$REPO_ROOT/requirements-dev.txt"
ensure_postgres
ensure_redis
ensure_chromium
ensure_faketime

export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
export CELERY_BROKER_URL="${CELERY_BROKER_URL:-redis://127.0.0.1:6379/15}"
export CONSOLE_DATA_DIR="${CONSOLE_DATA_DIR:-$REPO_ROOT/data/test}"

set +e
"$PY" -m pytest "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
    # pytest's "no tests were collected". A selection (-k, a path) may legitimately match
    # nothing; say so instead of failing.
    echo "pytest collected no tests for this selection"
    exit 0
fi
exit "$status"
