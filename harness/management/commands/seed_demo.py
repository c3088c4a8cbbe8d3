"""Seed demo users, orders, refund requests and proposals, so a newcomer can log in at once.

Idempotent: running it again changes nothing that exists. The orders' charges are registered
with the sandbox provider (when it is reachable) so that approved refunds can execute.

With the sandbox reachable it also seeds a scenario with an action in every state, built through
the console's own services (proposal, the manager's decision, the reservation, the worker's
recording of an answer, escalation, the ledger audit), so each page has something to show:

- 4901 REJECTED: maria rejects the proposal.
- 4902 STALE: approved two days ago; the approval expired before a worker reserved it.
- 4903 CANCELLED: maria cancels it before any reservation.
- 4904 SUBMITTING: reserved fifteen minutes ago, and its lease expired with no answer. Once the
  worker runs, the lease sweeper moves it to UNKNOWN and reconciliation finishes it.
- 4905 SETTLING: the provider accepted it; its final status is pending.
- 4906 SUCCEEDED: sent to the sandbox for real.
- 4907 FAILED_FINAL: the provider refused it for good (a disputed charge); a remedy is open.
- 4908 UNKNOWN: the call timed out. The order's payment is not at the provider, so lookups
  cannot conclude and, after the escalation policy's three, reconciliation hands it to finance.
- 4909 NEEDS_REVIEW: the call timed out but the refund was made; escalated to fiona, who can
  look it up and confirm it.
- 4910: someone refunded part of the order by hand at the provider; the ledger audit finds an
  effect with no action (an open discrepancy).
- Bill INV-2297 (with the accounting sandbox): an invoice adjustment whose credit note the
  accounting system saved but whose answer was lost; escalated to alex (accounts payable), who
  can look it up and record it as succeeded.

The answers recorded for 4904-4909 are written by this command, not received (the evidence says
so), except 4906's, which the sandbox really gave. There is no lasting AUTHORIZED action: a
worker picks one up within seconds, so approve one of the PROPOSED ones to watch it go.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils import timezone

from actions.agents.services import agent_token_issue
from actions.engine.claim import Claim, ClaimOutcome, submission_begin
from actions.engine.dispatch import submission_send_and_record
from actions.engine.escalation import action_escalate
from actions.engine.ledger import ledger_audit_run
from actions.engine.outcomes import apply_outcome
from actions.engine.resolution_checks import ReviewRefused
from actions.kinds.base import Answer, Outcome
from actions.kinds.refund.contract import RefundReceiver, answer_from_refund, refund_action_id
from actions.kinds.refund.proposal import action_propose_refund
from actions.kinds.supplier_email.proposal import supplier_email_propose
from actions.models import (
    Action,
    ActionStatus,
    Agent,
    Attempt,
    Discrepancy,
    Order,
    RefundRequest,
    Supplier,
    SupplierContact,
)
from actions.providers.base import AmbiguousError, DefinitiveError
from actions.providers.money import to_minor_units
from actions.providers.stripe_adapter import StripeProvider, refund_from_stripe_json
from actions.review.services import action_assign
from actions.services import Actor, action_cancel
from approvals.models import ApprovalLimit
from approvals.services import approval_decide
from console.roles import ensure_roles
from harness.demo.bills import plant_credit_note, seed_demo_bills, seed_review_adjustment

DEMO_PASSWORD = "demo-password"  # noqa: S105 - printed in the README for the local demo only

USERS: list[dict[str, Any]] = [
    {
        "username": "maria",
        "name": ("Maria", "Manager"),
        "roles": ["manager"],
        "limits": {"EUR": "500", "USD": "500", "GBP": "400", "JPY": "60000"},
    },
    {"username": "mark", "name": ("Mark", "Manager"), "roles": ["manager"], "limits": {"EUR": "100"}},
    {"username": "fiona", "name": ("Fiona", "Finance"), "roles": ["finance"]},
    {"username": "felix", "name": ("Felix", "Finance"), "roles": ["finance"]},
    {"username": "adam", "name": ("Adam", "Admin"), "roles": ["admin"], "staff": True},
    {"username": "otto", "name": ("Otto", "Owner"), "roles": ["agent"]},
    {"username": "alex", "name": ("Alex", "Payable"), "roles": ["accounts payable"]},
]

# number, customer, currency, captured, days since payment
ORDERS = [
    ("4821", "Ada Lovelace", "EUR", "120.00", 3),
    ("4822", "Alan Turing", "EUR", "89.90", 5),
    ("4823", "Grace Hopper", "USD", "240.00", 1),
    ("4824", "Edsger Dijkstra", "EUR", "35.00", 8),
    ("4825", "Barbara Liskov", "GBP", "64.50", 2),
    ("4826", "Katherine Johnson", "JPY", "12800", 4),
    ("4827", "Donald Knuth", "EUR", "310.00", 12),
    ("4828", "Margaret Hamilton", "USD", "58.00", 6),
]

# order, amount, reason, evidence: above the auto-approval thresholds, so they wait for a manager
PROPOSALS = [
    ("4821", "45.00", "damaged", "Customer sent photos of a cracked screen (ticket T-1001)."),
    ("4823", "240.00", "not_received", "Carrier confirms the parcel was lost in transit (ticket T-1002)."),
    ("4825", "64.50", "cancelled_order", "Order cancelled before dispatch (ticket T-1003)."),
    ("4827", "150.00", "not_as_described", "Wrong colour delivered; customer returned it (ticket T-1004)."),
]

# The scenario's orders: number, customer, currency, captured, days since payment, refund amount.
SCENARIO_ORDERS = [
    ("4901", "Frances Allen", "EUR", "80.00", 6, "35.00"),
    ("4902", "John Backus", "EUR", "140.00", 9, "70.00"),
    ("4903", "Radia Perlman", "EUR", "60.00", 3, "60.00"),
    ("4904", "Leslie Lamport", "EUR", "95.00", 2, "95.00"),
    ("4905", "Frances Spence", "USD", "130.00", 4, "60.00"),
    ("4906", "Ken Thompson", "EUR", "70.00", 5, "42.00"),
    ("4907", "Sophie Wilson", "GBP", "85.00", 7, "40.00"),
    ("4908", "Dennis Ritchie", "EUR", "150.00", 1, "150.00"),
    ("4909", "Adele Goldberg", "EUR", "220.00", 2, "120.00"),
    ("4910", "Jean Sammet", "EUR", "45.00", 10, ""),
]
# The payment of this order is not at the provider, so lookups cannot conclude (see the table above).
CHARGE_NOT_AT_PROVIDER = "4908"
DEMO_EVIDENCE = {"demo": "answer written by seed_demo, not received from the provider"}


class SandboxUnreachable(Exception):
    pass


class Command(BaseCommand):
    help = "Seed demo users (password: demo-password), orders, refund requests, proposals and a scenario."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--sandbox", default=settings.PROVIDER_API_BASE, help="the sandbox provider's address")

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.DEBUG:
            # Demo users with known passwords, an agent token written to a file and invented
            # orders: never on a production database.
            raise CommandError(
                "seed_demo refuses to run with DEBUG off: it creates demo users with known passwords. "
                "It is for development (`make start` sets DEBUG=1)."
            )
        ensure_roles()
        sandbox = options["sandbox"].rstrip("/")
        with transaction.atomic():
            users = {spec["username"]: self._user(spec) for spec in USERS}
            agent, _ = Agent.objects.get_or_create(
                name="support-bot", defaults={"owner": users["otto"], "scopes": ["refund"]}
            )
            orders = [self._order(*row) for row in ORDERS]
        reachable = self._register_charges(sandbox, orders)

        actor = Actor.for_agent(agent)
        for number, amount, reason, evidence in PROPOSALS:
            order = Order.objects.get(number=number)
            # The support ticket the evidence names (T-1001 ...) is the request's reference: searching
            # for it finds the order, as the README's example does.
            ticket = evidence.rsplit("ticket ", 1)[1].rstrip(").")
            request, _ = RefundRequest.objects.get_or_create(
                order=order, number=1, defaults={"external_reference": ticket, "note": evidence}
            )
            action_propose_refund(
                order_number=number,
                request_number=request.number,
                amount=amount,
                currency=order.currency,
                reason_code=reason,
                evidence=evidence,
                proposer=actor,
            )

        # A supplier with its known contacts, and an email to it waiting for a manager, who
        # sees the message exactly as it will be sent.
        with transaction.atomic():
            acme, _ = Supplier.objects.get_or_create(code="ACME", defaults={"name": "Acme Supplies"})
            for email, name in (("ap@acme.example", "Accounts payable"), ("ann@acme.example", "Ann Example")):
                SupplierContact.objects.get_or_create(supplier=acme, email=email, defaults={"name": name})
        supplier_email_propose(
            supplier="ACME",
            reference="bill-BL-1042",
            template="bill_adjusted",
            parameters={
                "supplier_name": "Acme Supplies",
                "bill_number": "BL-1042",
                "amount": "120.00",
                "currency": "EUR",
                "reason": "Two pallets arrived damaged (delivery note DN-3321).",
            },
            to="ap@acme.example",
            evidence="The credit note for bill BL-1042 was issued today.",
            proposer=actor,
        )

        if settings.ACCOUNTING_API_BASE:
            self.stdout.write(seed_demo_bills(accounting=settings.ACCOUNTING_API_BASE, owner=users["otto"]))
        token_note = self._demo_token(agent)
        if reachable:
            Scenario(self, sandbox=sandbox, users=users, proposer=actor).seed()
        else:
            self.stderr.write("The scenario with an action in every state needs the sandbox; it was not seeded.")
        self.stdout.write(
            self.style.SUCCESS(
                f"Demo data ready: {Order.objects.count()} orders, {Action.objects.count()} actions. "
                f"Log in at {settings.CONSOLE_BASE_URL.rstrip('/')}/ as maria (manager), fiona (finance), alex "
                f"(accounts payable), otto (agent owner) or adam (admin) with password {DEMO_PASSWORD!r}."
            )
        )
        self.stdout.write(token_note)

    def _demo_token(self, agent: Agent) -> str:
        """An API token for the demo agent, so an agent developer can call the API at once.

        Like every token it is stored hashed; its only copy is this local demo file, written
        once (a real token is shown once by create_agent and never written down).
        """
        path = Path(settings.DATA_DIR) / "demo-agent-token.txt"
        if not path.exists():
            path.write_text(agent_token_issue(agent=agent, label="demo").plain + "\n")
            path.chmod(0o600)
        return (
            f"The demo agent support-bot's API token is in {path} "
            f'(curl -H "Authorization: Bearer $(cat {path})" {settings.CONSOLE_BASE_URL.rstrip("/")}/api/v1/actions).'
        )

    def _user(self, spec: dict[str, Any]) -> User:
        user, created = User.objects.get_or_create(
            username=spec["username"],
            defaults={
                "first_name": spec["name"][0],
                "last_name": spec["name"][1],
                "email": f"{spec['username']}@example.com",
                "is_staff": spec.get("staff", False),
                "is_superuser": spec.get("superuser", False),
            },
        )
        if created:
            user.set_password(DEMO_PASSWORD)
            user.save(update_fields=["password"])
        for role in spec["roles"]:
            user.groups.add(Group.objects.get(name=role))
        for currency, amount in spec.get("limits", {}).items():
            ApprovalLimit.objects.get_or_create(user=user, currency=currency, defaults={"max_amount": Decimal(amount)})
        return user

    def _order(self, number: str, customer: str, currency: str, captured: str, days: int) -> Order:
        order, _ = Order.objects.get_or_create(
            number=number,
            defaults={
                "customer_name": customer,
                "customer_email": f"{customer.split()[0].lower()}@example.com",
                "currency": currency,
                "captured_amount": Decimal(captured),
                "charge_reference": f"ch_demo_{number}",
                "paid_at": timezone.now() - timedelta(days=days),
            },
        )
        return order

    def _register_charges(self, sandbox: str, orders: list[Order]) -> bool:
        """Tell the sandbox about each order's charge; an existing charge is left as it is.

        Returns whether the sandbox could be reached.
        """
        for order in orders:
            try:
                sandbox_post(
                    sandbox,
                    "charges",
                    {
                        "id": order.charge_reference,
                        "amount": to_minor_units(order.captured_amount, order.currency),
                        "currency": order.currency.lower(),
                        "metadata": {"order": order.number},
                    },
                )
            except urllib.error.HTTPError as error:
                if error.code != 400:  # 400: the charge exists already
                    self.stderr.write(f"sandbox refused charge {order.charge_reference}: HTTP {error.code}")
            except SandboxUnreachable as error:
                self.stderr.write(
                    f"The sandbox at {sandbox} is not reachable ({error}); charges were not registered. "
                    "Start it and run seed_demo again."
                )
                return False
        return True


def sandbox_post(sandbox: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST to one of the sandbox's control endpoints (/_sandbox/<name>). Raises HTTPError or
    SandboxUnreachable."""
    request = urllib.request.Request(  # noqa: S310 - a configured http(s) address
        f"{sandbox}/_sandbox/{name}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
            answer: dict[str, Any] = json.loads(response.read() or b"{}")
            return answer
    except urllib.error.HTTPError:
        raise
    except OSError as error:
        raise SandboxUnreachable(str(error)) from error


class Scenario:
    """One action in every state, each step skipped when its action exists already."""

    def __init__(self, command: Command, *, sandbox: str, users: dict[str, User], proposer: Actor) -> None:
        self.command = command
        self.sandbox = sandbox
        self.users = users
        self.proposer = proposer
        self.maria = users["maria"]
        self.now = timezone.now()
        self.provider = StripeProvider(
            api_key=settings.PROVIDER_API_KEY,
            api_base=sandbox,
            timeout_seconds=settings.PROVIDER_TIMEOUT_SECONDS,
            key_retention=timedelta(seconds=settings.PROVIDER_KEY_RETENTION_SECONDS),
            lookup_visibility_delay=timedelta(seconds=settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS),
        )

    def seed(self) -> None:
        orders = {row[0]: self.command._order(*row[:5]) for row in SCENARIO_ORDERS}
        self.command._register_charges(
            self.sandbox, [order for number, order in orders.items() if number != CHARGE_NOT_AT_PROVIDER]
        )
        steps: list[tuple[str, Callable[[Order], None]]] = [
            ("4901", self.rejected),
            ("4902", self.stale),
            ("4903", self.cancelled),
            ("4904", self.stuck_submitting),
            ("4905", self.settling),
            ("4906", self.succeeded),
            ("4907", self.failed_final),
            ("4908", self.unknown),
            ("4909", self.needs_review),
        ]
        for number, step in steps:
            if Action.objects.filter(action_id=refund_action_id(order_number=number, request_number=1)).exists():
                continue
            step(orders[number])
        if not Discrepancy.objects.exists():
            self.discrepancy(orders["4910"])
        if settings.ACCOUNTING_API_BASE:
            self.payable_review()

    # --- building blocks ---------------------------------------------------------------------

    def ago(self, **delta: float) -> datetime:
        return self.now - timedelta(**delta)

    def propose(self, order: Order, *, at: datetime) -> Action:
        amount = next(row[5] for row in SCENARIO_ORDERS if row[0] == order.number)
        request, _ = RefundRequest.objects.get_or_create(
            order=order, number=1, defaults={"external_reference": f"T-{order.number}"}
        )
        return action_propose_refund(
            order_number=order.number,
            request_number=request.number,
            amount=amount,
            currency=order.currency,
            reason_code="damaged",
            evidence=f"Customer {order.customer_name} reported the item arrived broken (ticket T-{order.number}).",
            proposer=self.proposer,
            now=at,
        ).action

    def approve(self, action: Action, *, at: datetime) -> None:
        # The approval publishes a dispatch on commit; the worker finds the action taken already.
        approval_decide(action_pk=action.pk, user=self.maria, decision="approve", note="Photos check out.", now=at)

    def reserve(self, order: Order, *, proposed: datetime, reserved: datetime) -> Claim | None:
        action = self.propose(order, at=proposed)
        self.approve(action, at=proposed + timedelta(minutes=1))
        claim = submission_begin(action_pk=action.pk, now=reserved)
        if claim.outcome != ClaimOutcome.CLAIMED:
            # A running worker took it first: the scenario shows whatever the worker did.
            self.command.stderr.write(f"{action.action_id}: a worker took it first; its state is its own.")
            return None
        return claim

    def record(self, claim: Claim, answer: Answer, *, at: datetime) -> Action:
        """What the worker does with a provider's answer, for an answer written here."""
        assert claim.action is not None and claim.attempt is not None
        with transaction.atomic(durable=True):
            action = Action.objects.select_for_update().get(pk=claim.action.pk)
            Attempt.objects.filter(pk=claim.attempt.pk).update(
                response=answer.response_json(),
                error=answer.error_json(),
                outcome=answer.outcome.value,
                held_lease=True,
                finished_at=at,
            )
            apply_outcome(
                action=action,
                answer=answer,
                actor=Actor.system("dispatcher"),
                now=at,
                source="submission",
                evidence={"attempt_id": claim.attempt.pk, **DEMO_EVIDENCE},
            )
        return action

    def plant(self, action: Action, *, status: str) -> dict[str, Any]:
        """A refund that exists at the provider for the action (the sandbox's own record)."""
        return sandbox_post(
            self.sandbox,
            "refunds",
            {
                "charge": action.payload["charge"],
                "amount": to_minor_units(action.amount, action.currency),
                "status": status,
                "metadata": {"action_id": action.action_id},
                "idempotency_key": action.idempotency_key,
            },
        )

    # --- the states --------------------------------------------------------------------------

    def rejected(self, order: Order) -> None:
        action = self.propose(order, at=self.ago(hours=3))
        approval_decide(
            action_pk=action.pk,
            user=self.maria,
            decision="reject",
            note="A replacement was shipped instead (ticket T-4901).",
            now=self.ago(hours=2, minutes=50),
        )

    def stale(self, order: Order) -> None:
        action = self.propose(order, at=self.ago(hours=50))
        self.approve(action, at=self.ago(hours=49))
        # No worker reserved it within the approval's lifetime: the reservation finds it expired.
        submission_begin(action_pk=action.pk, now=self.ago(minutes=1))

    def cancelled(self, order: Order) -> None:
        action = self.propose(order, at=self.ago(days=1))
        action_cancel(action_pk=action.pk, actor=Actor.for_user(self.maria), reason="Duplicate of ticket T-4821.")

    def stuck_submitting(self, order: Order) -> None:
        self.reserve(order, proposed=self.ago(minutes=20), reserved=self.ago(minutes=15))

    def settling(self, order: Order) -> None:
        claim = self.reserve(order, proposed=self.ago(hours=3), reserved=self.ago(hours=2, minutes=55))
        if claim is None or claim.action is None:
            return
        refund = refund_from_stripe_json(self.plant(claim.action, status="pending"))
        self.record(claim, answer_from_refund(refund), at=self.ago(hours=2, minutes=55))

    def succeeded(self, order: Order) -> None:
        claim = self.reserve(order, proposed=self.ago(hours=6), reserved=self.now)
        if claim is None or claim.action is None or claim.attempt is None or claim.lease_token is None:
            return
        # A real call to the sandbox, outside any transaction, by the lease holder.
        submission_send_and_record(
            action=claim.action,
            attempt=claim.attempt,
            lease_token=claim.lease_token,
            receiver=RefundReceiver(self.provider),
        )

    def failed_final(self, order: Order) -> None:
        claim = self.reserve(order, proposed=self.ago(days=1), reserved=self.ago(hours=23))
        if claim is None:
            return
        error = DefinitiveError(
            "This charge is disputed and cannot be refunded.", code="charge_disputed", http_status=400
        )
        self.record(claim, Answer(Outcome.FAILED_FINAL, error=error), at=self.ago(hours=23))

    def unknown(self, order: Order) -> None:
        claim = self.reserve(order, proposed=self.ago(minutes=10), reserved=self.ago(minutes=9))
        if claim is None:
            return
        timeout = AmbiguousError("Read timed out after 10 s.", code="connection_error")
        self.record(claim, Answer(Outcome.UNKNOWN, error=timeout), at=self.ago(minutes=9))

    def needs_review(self, order: Order) -> None:
        claim = self.reserve(order, proposed=self.ago(hours=7), reserved=self.ago(hours=6, minutes=59))
        if claim is None or claim.action is None:
            return
        # The timeout hid a refund the provider did make: finance will find it with a lookup.
        self.plant(claim.action, status="succeeded")
        timeout = AmbiguousError("Read timed out after 10 s.", code="connection_error")
        action = self.record(claim, Answer(Outcome.UNKNOWN, error=timeout), at=self.ago(hours=6, minutes=59))
        self.hand_to(
            action,
            self.users["fiona"],
            at=self.ago(hours=5),
            reason="The customer's bank asked about this refund, so it goes to a person at once (demo data).",
            note="Taking it: the bank called me.",
        )

    def hand_to(self, action: Action, person: User, *, at: datetime, reason: str, note: str) -> None:
        """Escalate ``action`` at once (no lookups first) and have ``person`` take it."""
        with transaction.atomic(durable=True):
            action = Action.objects.select_for_update().get(pk=action.pk)
            action_escalate(
                action=action, actor=Actor.system("reconciler"), now=at, reason=reason, evidence=DEMO_EVIDENCE
            )
        action = Action.objects.get(pk=action.pk)
        if action.status == ActionStatus.NEEDS_REVIEW and action.owner != person:
            try:
                action_assign(action_pk=action.pk, user=person, note=note)
            except ReviewRefused as refused:
                self.command.stderr.write(f"{action.action_id} stays with its owner: {refused}")

    def payable_review(self) -> None:
        """An invoice adjustment for accounts payable: the accounting system saved its credit
        note, but the answer was lost; alex finds the note with a lookup and records it."""
        action = seed_review_adjustment(accounting=settings.ACCOUNTING_API_BASE)
        if action is None or action.status not in (ActionStatus.PROPOSED, ActionStatus.AUTHORIZED):
            return  # the accounting sandbox is not reachable, or an earlier seed did this
        if action.status == ActionStatus.PROPOSED:
            self.approve(action, at=self.now)
        claim = submission_begin(action_pk=action.pk, now=self.now)
        if claim.outcome != ClaimOutcome.CLAIMED or claim.action is None:
            self.command.stderr.write(f"{action.action_id}: a worker took it first; its state is its own.")
            return
        plant_credit_note(accounting=settings.ACCOUNTING_API_BASE, action=claim.action)
        lost = AmbiguousError("Read timed out after 10 s.", code="connection_error")
        action = self.record(claim, Answer(Outcome.UNKNOWN, error=lost), at=self.now)
        self.hand_to(
            action,
            self.users["alex"],
            at=self.now,
            reason="The supplier asked whether the credit note was issued, so it goes to a person at once (demo data).",
            note="Taking it: the supplier called me.",
        )

    def discrepancy(self, order: Order) -> None:
        # A refund made by hand in the provider's dashboard names no action.
        sandbox_post(self.sandbox, "refunds", {"charge": order.charge_reference, "amount": 1500, "status": "succeeded"})
        ledger_audit_run(receivers={"refund": RefundReceiver(self.provider)})
