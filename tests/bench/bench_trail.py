"""How long the audit trail's check takes: N actions with their chained events, written in bulk,
then a checkpoint over them and ``verify_trail`` over everything (docs/evidence.md).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        python -m tests.bench.bench_trail --actions 10000 [--events 4] [--keep]

Not a pytest test: it prints timings. It creates its own database (Django's test database
machinery, migrated), writes the rows in bulk (the chain computed here with the trail's own
functions, the rows inserted with ``bulk_create``, which is how a restore or an import would
write them; the services' path is what the dispatch benchmark measures), and drops the database
at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import io
import os
import time
from datetime import timedelta
from decimal import Decimal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--actions", type=int, default=10000)
    parser.add_argument("--events", type=int, default=4, help="events per action (default 4)")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark's database")
    args = parser.parse_args()
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    os.environ["DATABASE_TEST_NAME"] = f"bench_trail_{os.getpid()}"
    os.environ.setdefault("TRAIL_SIGNING_KEY", "bench-trail-signing-key-0123456789abcdef")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command
    from django.test.utils import setup_databases, teardown_databases
    from django.utils import timezone

    from actions.evidence.checkpoints import checkpoint_make
    from actions.foundation import sql
    from actions.foundation.chain import GENESIS, chain_link, content_hash
    from actions.foundation.trail import event_content_of
    from actions.models import Action, ActionEvent, ActionKind, ActionStatus, ActorKind

    names = setup_databases(verbosity=0, interactive=False)
    try:
        started = time.perf_counter()
        now = timezone.now()
        transitions = [("propose", "", "PROPOSED"), ("approve", "PROPOSED", "AUTHORIZED")]
        transitions += [("begin_submission", "AUTHORIZED", "SUBMITTING"), ("record_success", "SUBMITTING", "SUCCEEDED")]
        transitions += [("agent_owner_changed", "SUCCEEDED", "SUCCEEDED")] * max(0, args.events - len(transitions))
        transitions = transitions[: args.events]
        batch = 1000
        for first in range(0, args.actions, batch):
            actions = Action.objects.bulk_create(
                [
                    Action(
                        action_id=f"refund:bench-{n}:request-1",
                        kind=ActionKind.REFUND,
                        idempotency_key=f"refund:bench-{n}:request-1",
                        payload={"kind": "refund", "order": f"bench-{n}", "amount": "10.00", "currency": "EUR"},
                        payload_hash="sha256:" + "0" * 64,
                        amount=Decimal("10.00"),
                        currency="EUR",
                        reason_code="damaged",
                        status=ActionStatus.SUCCEEDED,
                    )
                    for n in range(first, min(first + batch, args.actions))
                ]
            )
            events = []
            for action in actions:
                previous = GENESIS
                for sequence, (transition, from_state, to_state) in enumerate(transitions, start=1):
                    event = ActionEvent(
                        action=action,
                        transition=transition,
                        from_state=from_state,
                        to_state=to_state,
                        actor_kind=ActorKind.SYSTEM,
                        actor_label="system:bench",
                        evidence={"step": sequence},
                        created_at=now + timedelta(microseconds=sequence),
                        sequence=sequence,
                    )
                    event.content_hash = content_hash(event_content_of(event))
                    event.chain_hash = previous = chain_link(previous, event.content_hash)
                    events.append(event)
            ActionEvent.objects.bulk_create(events)
        written = time.perf_counter() - started
        print(f"wrote {args.actions} actions, {args.actions * len(transitions)} events in {written:.1f} s")

        # The checkpoint covers the transactions that have ended (pg_snapshot_xmin, cluster-wide):
        # wait, with a deadline, until another session's open transaction no longer holds it back.
        newest = ActionEvent.objects.order_by("-txid").values_list("txid", flat=True).first() or 0
        deadline = time.monotonic() + 120
        while (sql.transactions_ended_below() or 0) <= newest and time.monotonic() < deadline:
            time.sleep(0.2)
        started = time.perf_counter()
        made = checkpoint_make().checkpoint
        print(
            f"checkpoint {made.number if made else '-'}: {made.event_count if made else 0} events in "
            f"{time.perf_counter() - started:.2f} s"
        )
        out = io.StringIO()
        started = time.perf_counter()
        call_command("verify_trail", stdout=out)
        print(out.getvalue().strip())
        print(f"verify_trail: {time.perf_counter() - started:.2f} s wall")
    finally:
        if not args.keep:
            teardown_databases(names, verbosity=0)


if __name__ == "__main__":
    main()
