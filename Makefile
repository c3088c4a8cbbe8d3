# The commands a newcomer needs, each doing all of its own set-up; and `make mutate`.
.PHONY: start test serve mutate

# Start the whole console on the embedded default (SQLite, filesystem broker, the sandbox
# provider), seeded with demo users and data: http://127.0.0.1:8000/
start:
	bash console/scripts/start.sh

# Run the whole test suite against PostgreSQL and Redis (started if they are down).
test:
	bash console/scripts/test.sh $(ARGS)

# The production profile, locally: gunicorn, a Celery worker and beat, on PostgreSQL and Redis
# (started if they are down), DEBUG off. /readyz answers 200 once all of it is up.
serve:
	bash console/scripts/serve.sh

# Mutation testing of the engine with mutmut (configured in pyproject.toml, results in
# tests/MUTATION.md). Slow, so not part of .ci/run. One module at a time, one worker:
#   make mutate MODULE=actions.outcomes TESTS="tests/actions/test_outcome_table.py"
# MODULE is a dotted module (or a mutant-name glob); TESTS narrows the fast test subset.
# `mutmut results` and `mutmut show NAME` then list and explain the survivors.
MODULE ?= actions.kinds.refund
TESTS ?=
CHILDREN ?= 2
mutate:
	bash -c 'source console/scripts/common.sh && ensure_venv "$$REPO_ROOT/requirements-dev.txt" && ensure_postgres' && \
	DATABASE_URL="$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}" \
	DATABASE_TEST_NAME="$${DATABASE_TEST_NAME:-test_console_mutants}" \
	CONSOLE_DATA_DIR="$${CONSOLE_DATA_DIR:-$(CURDIR)/data/test}" \
	MUTATE_TESTS="$(TESTS)" \
	.venv/bin/mutmut run --max-children $(CHILDREN) "$(MODULE).*"
