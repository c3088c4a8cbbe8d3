# The commands a newcomer needs. Each does all of its own set-up.
.PHONY: start test serve

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
