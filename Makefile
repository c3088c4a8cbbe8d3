# The two commands a newcomer needs. Both do all of their own set-up.
.PHONY: start test

# Start the whole console on the embedded default (SQLite, filesystem broker, the sandbox
# provider), seeded with demo users and data: http://127.0.0.1:8000/
start:
	bash console/scripts/start.sh

# Run the whole test suite against PostgreSQL and Redis (started if they are down).
test:
	bash console/scripts/test.sh $(ARGS)
