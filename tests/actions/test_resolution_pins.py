"""Finance's lookups and resolutions (``actions.engine.resolutions``), decided in memory.

The scenario tests in ``test_finance_services.py`` run against the sandbox provider's process,
which mutation runs leave out (tests/MUTATION.md). These drive the same services with an
in-memory receiver behind the real refund adapter, and pin what a clerk and the audit trail see:
each refusal's words, code and status, the lookup kept as an attempt row, each resolution's event
(reason, evidence, actor, time), the money, the remedy, and the message shown after it. Time is
frozen where a resolution's timing rule depends on it, so each boundary is checked to the
microsecond.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from actions.engine import resolution_checks, resolutions
from actions.engine.resolution_checks import ReviewRefused
from actions.kinds import kind_for
from actions.kinds.refund.contract import RefundReceiver
from actions.models import Action, ActionEvent, ActionStatus, Attempt, AttemptKind, Order, Remedy
from actions.providers.base import ProviderError, ProviderGuarantees, ProviderRefund, RefundStatus
from actions.services import Actor
from tests.actions.test_finance_services import escalated, money, provider_refund, snapshot, unknown
from tests.actions.test_reconciliation import NO_LOOKUP_NO_KEYS, FakeReceiver, authorized_refund, guarantees

pytestmark = pytest.mark.django_db(transaction=True)
S = ActionStatus

ASKABLE = guarantees(keys=True, lookup=True, authoritative=True)


@dataclass
class ScriptedReceiver(FakeReceiver):
    """The in-memory provider, whose lookups can also fail."""

    find_error: ProviderError | None = None

    def find_refunds(self, *, charge: str, action_id: str | None = None) -> list[ProviderRefund]:
        if self.find_error is not None:
            self.calls.append("find_refunds")
            raise self.find_error
        return super().find_refunds(charge=charge, action_id=action_id)


def receiver(
    *refunds: ProviderRefund, find_error: ProviderError | None = None, provider: ProviderGuarantees = ASKABLE
) -> tuple[RefundReceiver, ScriptedReceiver]:
    fake = ScriptedReceiver(provider, refunds=list(refunds), find_error=find_error)
    return RefundReceiver(fake), fake


def at_provider(
    action: Action, reference: str, status: RefundStatus = RefundStatus.SUCCEEDED, **raw: Any
) -> ProviderRefund:
    refund = provider_refund(action, reference=reference, status=status)
    if raw:
        fields = {"amount_minor": raw.get("amount", refund.amount_minor), "currency": raw.get("currency", "eur")}
        refund = ProviderRefund(
            id=refund.id,
            charge=refund.charge,
            amount_minor=fields["amount_minor"],
            currency=fields["currency"],
            status=refund.status,
            metadata=refund.metadata,
            created=refund.created,
            raw={**refund.raw, "amount": fields["amount_minor"], "currency": fields["currency"]},
        )
    return refund


class FrozenClock:
    """``resolutions.timezone`` with ``now()`` fixed: the timing rules' boundaries to the microsecond."""

    def __init__(self, now: datetime) -> None:
        self.instant = now

    def now(self) -> datetime:
        return self.instant

    def localtime(self, value: datetime) -> datetime:
        return timezone.localtime(value)


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> FrozenClock:
    clock = FrozenClock(timezone.now().replace(microsecond=500_000))
    monkeypatch.setattr(resolutions, "timezone", clock)
    return clock


@pytest.fixture
def review(agent_actor: Actor, finance: Any) -> Action:
    """A refund that timed out, escalated to finance: NEEDS_REVIEW, 20.00 EUR reserved."""
    return escalated(agent_actor, owner=finance)


def sent_at(action: Action, when: datetime, *, first: datetime | None = None) -> Action:
    Action.objects.filter(pk=action.pk).update(last_attempt_at=when, first_attempt_at=first or when)
    return Action.objects.get(pk=action.pk)


def last_event(action: Action) -> ActionEvent:
    return ActionEvent.objects.filter(action=action).latest("pk")


def lookup_rows(action: Action) -> list[Attempt]:
    return list(Attempt.objects.filter(action=action, kind=AttemptKind.LOOKUP).order_by("pk"))


def refused(call: Any) -> ReviewRefused:
    with pytest.raises(ReviewRefused) as caught:
        call()
    return caught.value


# --- input ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "required", "expected"),
    [
        ("  kept  ", True, "kept"),
        (None, False, ""),
        ("", False, ""),
        ("x" * 1000, True, "x" * 1000),
        (12, True, "12"),
    ],
)
def test_review_text_is_stripped_and_kept_up_to_a_thousand_characters(
    raw: object, required: bool, expected: str
) -> None:
    assert resolution_checks.review_text(raw, name="reason", required=required, label="Say why.") == expected


@pytest.mark.parametrize(
    ("raw", "required", "message", "code"),
    [
        ("a\x00b", False, "note: the text contains a NUL character.", "invalid"),
        ("x" * 1001, False, "note: keep it under 1000 characters.", "too_long"),
        ("   ", True, "note: Say why.", "required"),
        (None, True, "note: Say why.", "required"),
    ],
)
def test_bad_review_text_is_refused_naming_the_field(raw: object, required: bool, message: str, code: str) -> None:
    problem = refused(lambda: resolution_checks.review_text(raw, name="note", required=required, label="Say why."))
    assert (str(problem), problem.code, problem.status, problem.field) == (message, code, 400, "note")


@pytest.mark.parametrize(
    ("raw", "message", "code"),
    [
        ("", "provider_reference: give the receiver's reference for the refund (for example re_...).", "required"),
        ("  ", "provider_reference: give the receiver's reference for the refund (for example re_...).", "required"),
        (None, "provider_reference: give the receiver's reference for the refund (for example re_...).", "required"),
        ("re 1", "provider_reference: use the receiver's id as it shows it: letters, digits, '_' or '-'.", "invalid"),
        (
            "x" * 256,
            "provider_reference: use the receiver's id as it shows it: letters, digits, '_' or '-'.",
            "invalid",
        ),
        ("re_1\n", None, None),
    ],
)
def test_a_reference_is_the_receivers_id_as_it_shows_it(raw: object, message: str | None, code: str | None) -> None:
    if message is None:
        assert resolution_checks.checked_reference(raw, "refund") == "re_1"
        assert resolution_checks.checked_reference("Ab-9_" + "x" * 250, "refund") == "Ab-9_" + "x" * 250
        return
    problem = refused(lambda: resolution_checks.checked_reference(raw, "refund"))
    assert (str(problem), problem.code, problem.status, problem.field) == (message, code, 400, "provider_reference")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("", Decimal("20.00")),
        (None, Decimal("20.00")),
        ("5", Decimal("5.00")),
        (" 12.5 ", Decimal("12.50")),
        ("20.00", Decimal("20.00")),
        ("0.01", Decimal("0.01")),
        ("+3", Decimal("3.00")),
    ],
)
def test_the_amount_the_customer_still_expects_defaults_to_the_actions_and_is_kept_in_cents(
    review: Action, raw: object, expected: Decimal
) -> None:
    amount = resolution_checks.checked_expected_amount(raw, review)
    assert amount == expected
    assert str(amount) == str(expected), "quantized to the currency's two decimals"


@pytest.mark.parametrize("raw", ["0", "0.00", "-1", "20.01", "21", "5.001", "1e3", "abc", "5.", "NaN"])
def test_an_expected_amount_outside_one_cent_to_the_actions_amount_is_refused(review: Action, raw: str) -> None:
    problem = refused(lambda: resolution_checks.checked_expected_amount(raw, review))
    assert (str(problem), problem.code, problem.status, problem.field) == (
        "expected_amount: give an amount like 20.00 (EUR), at most the action's amount.",
        "invalid",
        400,
        "expected_amount",
    )


def test_a_remedy_must_be_one_the_kind_offers(review: Action) -> None:
    assert resolution_checks.checked_failure_choice("cheque", review) == "cheque"
    problem = refused(lambda: resolution_checks.checked_failure_choice("gift", review))
    assert (str(problem), problem.code, problem.status, problem.field) == (
        "remedy_kind: choose one of store credit, manual bank transfer, cheque, none (with a reason).",
        "invalid",
        400,
        "remedy_kind",
    )
    assert refused(lambda: resolution_checks.checked_failure_choice(None, review)).field == "remedy_kind"


def test_a_review_stamp_says_when_who_and_what_then_the_note(finance: Any) -> None:
    when = datetime(2026, 3, 4, 5, 6, 59, tzinfo=timezone.get_current_timezone())
    stamp = resolution_checks.review_stamp(when, finance, "opened", "why")
    assert stamp == "[2026-03-04 05:06 fiona.finance] opened: why"
    assert resolution_checks.review_stamp(when, finance, "opened", "") == "[2026-03-04 05:06 fiona.finance] opened"


# --- who may act ------------------------------------------------------------------------------------


def test_only_an_authenticated_user_with_the_permission_passes(finance: Any, manager: Any) -> None:
    resolution_checks.review_require(finance, "actions.resolve_action", "No.")
    for user in (manager, AnonymousUser(), object()):
        problem = refused(lambda user=user: resolution_checks.review_require(user, "actions.resolve_action", "No."))
        assert (str(problem), problem.code, problem.status) == ("No.", "not_allowed", 403)


def test_an_action_that_does_not_exist_is_a_404(db: Any) -> None:
    problem = refused(lambda: resolution_checks.review_action(999_999))
    assert (str(problem), problem.code, problem.status) == ("There is no such action.", "not_found", 404)
    with transaction.atomic():
        problem = refused(lambda: resolution_checks.review_action(999_999, lock=True))
    assert problem.code == "not_found"


def test_an_action_is_read_with_its_owner_for_the_owner_rule(review: Action, django_assert_num_queries: Any) -> None:
    action = resolution_checks.review_action(review.pk)
    with django_assert_num_queries(0):
        assert action.owner is not None and action.owner.get_username() == "fiona.finance"


def test_a_resolution_needs_the_transitions_own_permission_checked_again_under_the_lock(
    review: Action, manager: Any, finance: Any
) -> None:
    """The services check finance's permission first; the check on the locked row is the
    transition's own (django-fsm's), so a transition guarded otherwise is still refused."""
    problem = refused(lambda: resolutions._check_resolvable(review, manager, "resolve_succeeded"))
    assert (str(problem), problem.code, problem.status) == (
        "Only finance may resolve an action that needs review.",
        "not_allowed",
        403,
    )
    resolutions._check_resolvable(review, finance, "resolve_succeeded")  # allowed: nothing raised


def test_the_owner_rule_refuses_a_colleagues_item_and_allows_ones_own(finance: Any, felix: Any, settings: Any) -> None:
    settings.REVIEW_OWNERS_ONLY = True
    resolution_checks.review_owner_rule(finance, finance)
    resolution_checks.review_owner_rule(finance, None)
    problem = refused(lambda: resolution_checks.review_owner_rule(finance, felix))
    assert (problem.code, problem.status) == ("not_owner", 403)
    assert str(problem).startswith("This item belongs to felix.finance.")


@pytest.fixture
def felix(db: Any) -> Any:
    from tests.factories import make_user

    return make_user("felix.finance", "finance")


# --- the live lookup --------------------------------------------------------------------------------


def test_a_lookup_keeps_the_receivers_whole_answer_as_an_attempt_and_changes_nothing(
    review: Action, finance: Any
) -> None:
    refund = at_provider(review, "re_seen")
    live, fake = receiver(refund)
    before = snapshot(review)

    result = resolutions.action_lookup(action_pk=review.pk, user=finance, receiver=live)

    assert fake.calls == ["find_refunds"]
    assert result.lookup.verdict == "found"
    assert result.action.pk == review.pk
    [row] = lookup_rows(review)
    assert result.attempt == row
    assert row.idempotency_key == review.idempotency_key
    assert row.request == {
        "charge": review.payload["charge"],
        "action_id": review.action_id,
        "refund_id": "",
        "for_status": S.NEEDS_REVIEW,
        "requested_by": "fiona.finance",
        "purpose": "lookup",
    }
    assert row.response == {"effects": [refund.raw]}
    assert row.error is None
    assert row.outcome == "found"
    assert row.started_at is not None and row.finished_at is not None and row.started_at <= row.finished_at
    assert snapshot(review) == before


def test_an_inconclusive_lookup_keeps_the_receivers_error(review: Action, finance: Any) -> None:
    live, _ = receiver(find_error=ProviderError("upstream down", code="api_error", http_status=502))

    result = resolutions.action_lookup(action_pk=review.pk, user=finance, receiver=live)

    [row] = lookup_rows(review)
    assert (result.lookup.verdict, row.outcome) == ("inconclusive", "inconclusive")
    assert row.error == {"type": "ProviderError", "code": "api_error", "message": "upstream down"}
    assert row.response == {"effects": []}


def test_a_receiver_without_lookups_is_not_asked_and_nothing_is_recorded(review: Action, finance: Any) -> None:
    live, fake = receiver(provider=NO_LOOKUP_NO_KEYS)
    problem = refused(lambda: resolutions.action_lookup(action_pk=review.pk, user=finance, receiver=live))
    assert (str(problem), problem.code, problem.status) == (
        "The provider offers no lookup: only its own records can tell.",
        "no_lookup",
        409,
    )
    assert fake.calls == []
    assert lookup_rows(review) == []


def test_an_action_never_sent_is_not_looked_up_and_says_so(agent_actor: Actor, finance: Any) -> None:
    action = authorized_refund(agent_actor)
    live, fake = receiver()
    problem = refused(lambda: resolutions.action_lookup(action_pk=action.pk, user=finance, receiver=live))
    assert (str(problem), problem.code) == (
        f"{action.action_id} has never been sent: there is nothing to look up.",
        "never_sent",
    )
    assert fake.calls == []


def test_a_lookup_needs_finance_and_respects_the_owner_rule(
    review: Action, manager: Any, felix: Any, settings: Any
) -> None:
    live, fake = receiver()
    problem = refused(lambda: resolutions.action_lookup(action_pk=review.pk, user=manager, receiver=live))
    assert (str(problem), problem.status) == ("Only finance may look actions up at the receiver.", 403)
    settings.REVIEW_OWNERS_ONLY = True
    problem = refused(lambda: resolutions.action_lookup(action_pk=review.pk, user=felix, receiver=live))
    assert problem.code == "not_owner"
    assert fake.calls == []
    assert lookup_rows(review) == []


@pytest.mark.parametrize("service", ["lookup", "succeeded", "failed", "retry", "resend"])
def test_without_a_receiver_given_each_service_asks_the_one_configured_for_this_action(
    review: Action, finance: Any, monkeypatch: pytest.MonkeyPatch, service: str
) -> None:
    """The console's own pages pass no receiver: each service must find the one configured for
    the action it acts on (not for no action at all)."""
    review = sent_at(review, timezone.now() - timedelta(days=1))  # long quiet: failed is allowed
    live, fake = receiver(
        *([at_provider(review, "re_done")] if service == "succeeded" else []),
        provider=NO_LOOKUP_NO_KEYS if service == "resend" else ASKABLE,
    )
    if service == "retry":
        looked_up(review, finance, live)  # a retry needs a fresh not-found on record first
        fake.calls.clear()
    asked_for: list[int] = []

    def configured(action: Action) -> RefundReceiver:
        asked_for.append(action.pk)
        return live

    monkeypatch.setattr(resolutions, "receiver_for", configured)
    call = {
        "lookup": lambda: resolutions.action_lookup(action_pk=review.pk, user=finance),
        "succeeded": lambda: resolutions.action_resolve_succeeded(
            action_pk=review.pk, user=finance, provider_reference="re_done", reason="r"
        ),
        "failed": lambda: resolutions.action_resolve_failed(
            action_pk=review.pk, user=finance, reason="r", remedy_kind="cheque"
        ),
        "retry": lambda: resolutions.action_resolve_retry(action_pk=review.pk, user=finance, reason="r"),
        "resend": lambda: resolutions.action_resolve_resend(action_pk=review.pk, user=finance, reason="r"),
    }[service]

    call()

    assert asked_for == [review.pk]
    assert fake.calls == {"retry": ["find_refunds", "create_refund"], "resend": ["create_refund"]}.get(
        service, ["find_refunds"]
    )


# --- confirmed as succeeded ---------------------------------------------------------------------------


def test_a_refund_the_receiver_shows_is_recorded_as_succeeded_booked_once_with_its_check_on_record(
    review: Action, finance: Any, frozen: FrozenClock
) -> None:
    live, fake = receiver(at_provider(review, "re_done"))

    resolution = resolutions.action_resolve_succeeded(
        action_pk=review.pk,
        user=finance,
        provider_reference=" re_done ",
        reason=" Seen in the dashboard. ",
        receiver=live,
    )

    action = Action.objects.get(pk=review.pk)
    assert (action.status, action.provider_reference) == (S.SUCCEEDED, "re_done")
    assert money(action) == (Decimal("20.00"), Decimal("0.00"))
    assert fake.calls == ["find_refunds"]
    [check] = lookup_rows(review)
    assert check.request["purpose"] == "check before resolving as succeeded"
    assert check.request["requested_by"] == "fiona.finance"
    assert (check.outcome, check.started_at, check.finished_at) == ("found", frozen.instant, frozen.instant)
    event = last_event(review)
    assert (event.transition, event.from_state, event.to_state) == ("resolve_succeeded", S.NEEDS_REVIEW, S.SUCCEEDED)
    assert (event.actor_user, event.reason, event.created_at) == (finance, "Seen in the dashboard.", frozen.instant)
    assert event.evidence == {
        "resolution": "succeeded",
        "provider_reference": "re_done",
        "check_attempt_id": check.pk,
        "provider_answer": "found",
    }
    assert resolution.check == check
    assert resolution.outcome == S.SUCCEEDED
    assert resolution.action.status == S.SUCCEEDED
    assert resolution.message == (
        f"{review.action_id} is recorded as succeeded with the provider's refund re_done; "
        f"20.00 EUR is booked on order {review.payload['order']}."
    )


@pytest.mark.parametrize("given", ["", "  ", None])
def test_with_no_reference_given_the_kinds_own_reference_is_confirmed(
    review: Action, finance: Any, monkeypatch: pytest.MonkeyPatch, given: object
) -> None:
    """A receiver that issues no reference of its own (an email's Message-ID is the console's):
    a blank field means the kind's default, which the receiver must still show."""
    monkeypatch.setattr(type(kind_for("refund")), "default_reference", lambda self, action: f"re_own_{action.pk}")
    live, _ = receiver(at_provider(review, f"re_own_{review.pk}"))

    resolution = resolutions.action_resolve_succeeded(
        action_pk=review.pk, user=finance, provider_reference=given, reason="r", receiver=live
    )

    assert Action.objects.get(pk=review.pk).provider_reference == f"re_own_{review.pk}"
    assert resolution.outcome == S.SUCCEEDED


def test_with_no_reference_given_and_none_of_the_kinds_own_the_clerk_is_asked_for_it(
    review: Action, finance: Any
) -> None:
    live, fake = receiver(at_provider(review, "re_done"))
    problem = refused(
        lambda: resolutions.action_resolve_succeeded(
            action_pk=review.pk, user=finance, provider_reference=" ", reason="r", receiver=live
        )
    )
    assert (str(problem), problem.field) == (
        "provider_reference: give the receiver's reference for the refund (for example re_...).",
        "provider_reference",
    )
    assert fake.calls == []


def test_a_kind_that_needs_written_evidence_refuses_a_confirmation_without_it(
    review: Action, finance: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the receiver cannot be asked (an email), the person's quoted evidence is the record."""
    monkeypatch.setattr(type(kind_for("refund")), "confirmation_needs_evidence", True)
    live, fake = receiver(at_provider(review, "re_done"))

    def confirm(evidence: str) -> Any:
        return resolutions.action_resolve_succeeded(
            action_pk=review.pk,
            user=finance,
            provider_reference="re_done",
            reason="r",
            evidence=evidence,
            receiver=live,
        )

    problem = refused(lambda: confirm(" "))
    assert (str(problem), problem.code, problem.field) == (
        "evidence: Quote the evidence that the refund arrived (a reply, a relay's log line).",
        "required",
        "evidence",
    )
    problem = refused(lambda: confirm("bad\x00"))
    assert (str(problem), problem.field) == ("evidence: the text contains a NUL character.", "evidence")
    assert fake.calls == []
    confirm("The customer's bank statement shows it.")
    assert last_event(review).evidence["evidence"] == "The customer's bank statement shows it."


def test_a_resolution_rereads_the_row_under_a_lock_before_applying_its_policy(review: Action, finance: Any) -> None:
    """Between the lookup and the decision, a worker or a colleague may have moved the action:
    the decision is taken on the row as it is, held until the commit."""
    live, _ = receiver(at_provider(review, "re_done"))
    with CaptureQueriesContext(connection) as queries:
        resolutions.action_resolve_succeeded(
            action_pk=review.pk, user=finance, provider_reference="re_done", reason="r", receiver=live
        )
    locked = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith('SELECT "actions_action"') and q["sql"].endswith('FOR UPDATE OF "actions_action"')
    ]
    assert len(locked) == 1, locked


def test_the_persons_evidence_is_kept_on_the_event_when_given(review: Action, finance: Any) -> None:
    live, _ = receiver(at_provider(review, "re_done"))
    resolutions.action_resolve_succeeded(
        action_pk=review.pk,
        user=finance,
        provider_reference="re_done",
        reason="ok",
        evidence=" Dashboard line 4. ",
        receiver=live,
    )
    assert last_event(review).evidence["evidence"] == "Dashboard line 4."


def test_of_two_refunds_for_one_action_the_one_named_is_recorded_and_booked_once(review: Action, finance: Any) -> None:
    live, _ = receiver(at_provider(review, "re_a"), at_provider(review, "re_b"))
    resolutions.action_resolve_succeeded(
        action_pk=review.pk, user=finance, provider_reference="re_b", reason="The second one.", receiver=live
    )
    action = Action.objects.get(pk=review.pk)
    assert (action.status, action.provider_reference) == (S.SUCCEEDED, "re_b")
    assert money(action) == (Decimal("20.00"), Decimal("0.00"))
    assert last_event(review).evidence["provider_answer"] == "duplicate"


@pytest.mark.parametrize(
    ("planted", "named", "message"),
    [
        ((), "re_x", "The provider has no refund for this action, so it cannot be confirmed as succeeded."),
        (
            (("re_a", RefundStatus.SUCCEEDED, {}), ("re_b", RefundStatus.SUCCEEDED, {})),
            "re_c",
            "The provider has 2 of them for this action (re_a (succeeded), re_b (succeeded)). Name the one to "
            "record as this action's effect; the other stays open as a discrepancy.",
        ),
        ((("re_a", RefundStatus.SUCCEEDED, {}),), "re_b", "The provider's refund for this action is re_a, not re_b."),
        ((("re_a", RefundStatus.PENDING, {}),), "re_a", "The provider's refund re_a is pending, not succeeded."),
        (
            (("re_a", RefundStatus.SUCCEEDED, {"amount": 1500}),),
            "re_a",
            "The provider's refund re_a is for 1500 EUR (minor units), not 2000 EUR.",
        ),
        (
            (("re_a", RefundStatus.SUCCEEDED, {"currency": "usd"}),),
            "re_a",
            "The provider's refund re_a is for 2000 USD (minor units), not 2000 EUR.",
        ),
        (
            (("re_a", RefundStatus.SUCCEEDED, {}), ("re_b", RefundStatus.PENDING, {})),
            "re_b",
            "The provider's refund re_b is pending, not succeeded.",
        ),
    ],
    ids=["not-found", "two-none-named", "another-reference", "pending", "amount", "currency", "named-one-pending"],
)
def test_succeeded_is_refused_when_the_receiver_disagrees_and_its_answer_is_kept(
    review: Action, finance: Any, planted: tuple[Any, ...], named: str, message: str
) -> None:
    live, _ = receiver(*(at_provider(review, ref, status, **raw) for ref, status, raw in planted))
    before = snapshot(review)

    problem = refused(
        lambda: resolutions.action_resolve_succeeded(
            action_pk=review.pk, user=finance, provider_reference=named, reason="ok", receiver=live
        )
    )

    assert (str(problem), problem.code, problem.status) == (message, "provider_disagrees", 409)
    assert snapshot(review) == before
    [check] = lookup_rows(review)
    assert check.request["purpose"] == "check before resolving as succeeded"


def test_succeeded_is_refused_when_the_receiver_cannot_be_asked_now(review: Action, finance: Any) -> None:
    live, _ = receiver(find_error=ProviderError("upstream down", code="api_error"))
    problem = refused(
        lambda: resolutions.action_resolve_succeeded(
            action_pk=review.pk, user=finance, provider_reference="re_a", reason="ok", receiver=live
        )
    )
    assert str(problem) == (
        "The provider could not confirm it (upstream down (code=api_error)). "
        "Nothing is recorded as succeeded without its answer."
    )
    assert Action.objects.get(pk=review.pk).status == S.NEEDS_REVIEW
    assert [row.outcome for row in lookup_rows(review)] == ["inconclusive"]


def test_where_the_receiver_cannot_be_asked_the_persons_word_is_the_record_and_the_check_says_so(
    review: Action, finance: Any
) -> None:
    live, fake = receiver(provider=NO_LOOKUP_NO_KEYS)
    resolutions.action_resolve_succeeded(
        action_pk=review.pk, user=finance, provider_reference="re_by_hand", reason="Phoned them.", receiver=live
    )
    assert fake.calls == []
    [check] = lookup_rows(review)
    assert (check.outcome, check.response) == ("no_lookup", None)
    assert check.error == {"type": "NoLookup", "code": None, "message": "The receiver offers no lookup."}
    assert last_event(review).evidence["provider_answer"] == "no_lookup"
    assert Action.objects.get(pk=review.pk).status == S.SUCCEEDED


def test_an_action_that_left_review_while_the_receiver_was_asked_is_refused_and_the_answer_kept(
    review: Action, finance: Any
) -> None:
    """The lookup runs outside the transaction: the action is checked again under its lock."""
    live, fake = receiver(at_provider(review, "re_done"))

    def meanwhile(*, charge: str, action_id: str | None = None) -> list[ProviderRefund]:
        Action.objects.filter(pk=review.pk).update(status=S.FAILED_FINAL)
        return FakeReceiver.find_refunds(fake, charge=charge, action_id=action_id)

    fake.find_refunds = meanwhile  # type: ignore[method-assign]
    problem = refused(
        lambda: resolutions.action_resolve_succeeded(
            action_pk=review.pk, user=finance, provider_reference="re_done", reason="ok", receiver=live
        )
    )
    assert (str(problem), problem.code, problem.status) == (
        f"{review.action_id} is failed (final) now, not waiting for review. Reload the page to see what happened.",
        "not_needs_review",
        409,
    )
    assert [row.outcome for row in lookup_rows(review)] == ["found"]
    order = Order.objects.get(actions=review)
    assert (order.refunded_amount, order.reserved_amount) == (Decimal("0.00"), Decimal("20.00")), "nothing booked"


def test_a_manager_may_not_resolve_and_nobody_is_asked(review: Action, manager: Any) -> None:
    live, fake = receiver(at_provider(review, "re_done"))
    for call in (
        lambda: resolutions.action_resolve_succeeded(
            action_pk=review.pk, user=manager, provider_reference="re_done", reason="ok", receiver=live
        ),
        lambda: resolutions.action_resolve_failed(action_pk=review.pk, user=manager, reason="ok", receiver=live),
        lambda: resolutions.action_resolve_retry(action_pk=review.pk, user=manager, reason="ok", receiver=live),
        lambda: resolutions.action_resolve_resend(action_pk=review.pk, user=manager, reason="ok", receiver=live),
    ):
        problem = refused(call)
        assert (str(problem), problem.code, problem.status) == (
            "Only finance may resolve an action that needs review.",
            "not_allowed",
            403,
        )
    assert fake.calls == []
    assert lookup_rows(review) == []


# --- recorded as failed -------------------------------------------------------------------------------


def quiet(action: Action, clock: FrozenClock, settings: Any, *, extra: timedelta = timedelta(0)) -> Action:
    """Last sent long enough ago that no attempt can still reach the receiver (lease + visibility)."""
    return sent_at(action, clock.instant - timedelta(seconds=settings.LEASE_SECONDS) - extra)


def test_a_refund_the_receiver_never_made_is_failed_its_reservation_released_and_a_remedy_opened(
    review: Action, finance: Any, frozen: FrozenClock, settings: Any
) -> None:
    review = quiet(review, frozen, settings)
    live, fake = receiver()

    resolution = resolutions.action_resolve_failed(
        action_pk=review.pk,
        user=finance,
        reason=" Never arrived. ",
        remedy_kind="cheque",
        expected_amount="12.5",
        receiver=live,
    )

    action = Action.objects.get(pk=review.pk)
    assert action.status == S.FAILED_FINAL
    assert money(action) == (Decimal("0.00"), Decimal("0.00"))
    assert fake.calls == ["find_refunds"]
    [check] = lookup_rows(review)
    assert (check.request["purpose"], check.outcome) == ("check before resolving as failed", "not_found")
    event = last_event(review)
    assert (event.transition, event.to_state, event.actor_user) == ("resolve_failed", S.FAILED_FINAL, finance)
    assert (event.reason, event.created_at) == ("Never arrived.", frozen.instant)
    assert event.evidence == {
        "resolution": "failed_final",
        "remedy_kind": "cheque",
        "expected_amount": "12.50",
        "check_attempt_id": check.pk,
        "provider_answer": "not_found",
    }
    remedy = Remedy.objects.get(action=review)
    assert (remedy.kind, remedy.amount, remedy.currency, remedy.owner) == ("cheque", Decimal("12.50"), "EUR", finance)
    stamp = f"[{timezone.localtime(frozen.instant):%Y-%m-%d %H:%M} fiona.finance] opened as cheque: Never arrived."
    assert remedy.note == stamp
    assert (resolution.remedy, resolution.check, resolution.outcome) == (remedy, check, S.FAILED_FINAL)
    assert (resolution.action.pk, resolution.action.status) == (review.pk, S.FAILED_FINAL)
    assert resolution.message == (
        f"{review.action_id} is recorded as failed for good; the reservation is released and a remedy "
        "(cheque, 12.50 EUR) is open for fiona.finance."
    )


def test_a_refund_the_receiver_records_as_failed_may_be_failed_at_once(
    review: Action, finance: Any, frozen: FrozenClock
) -> None:
    """A failed record is proof: no waiting for late attempts (the timing rule is for not-found)."""
    frozen.instant -= timedelta(days=1)  # the remedy's stamp is the resolution's time, not the wall clock's
    sent_at(review, frozen.instant)
    live, _ = receiver(at_provider(review, "re_failed", RefundStatus.FAILED))
    resolutions.action_resolve_failed(
        action_pk=review.pk, user=finance, reason="Declined.", remedy_kind="store_credit", receiver=live
    )
    assert Action.objects.get(pk=review.pk).status == S.FAILED_FINAL
    remedy = Remedy.objects.get(action=review)
    assert remedy.amount == Decimal("20.00")
    # The note names the remedy as the clerk chose it ("Store credit"), not by its code.
    stamp = f"[{timezone.localtime(frozen.instant):%Y-%m-%d %H:%M} fiona.finance] opened as store credit: Declined."
    assert remedy.note == stamp


def test_a_kind_that_offers_no_remedy_records_failed_with_none_chosen(
    review: Action, finance: Any, frozen: FrozenClock, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without choices the form sends no remedy_kind: the choice is empty, not invented."""
    kind = type(kind_for("refund"))
    monkeypatch.setattr(kind, "failure_choices", ())
    chosen: list[str] = []
    monkeypatch.setattr(kind, "failure_resolved", lambda self, action, *, choice, **_: chosen.append(choice))
    review = quiet(review, frozen, settings)
    live, _ = receiver()

    resolution = resolutions.action_resolve_failed(action_pk=review.pk, user=finance, reason="r", receiver=live)

    assert chosen == [""]
    assert last_event(review).evidence["remedy_kind"] == ""
    assert resolution.remedy is None
    assert resolution.message == f"{review.action_id} is recorded as failed for good; the reservation is released."


def test_a_missing_charge_proves_no_refund_and_may_be_failed_at_once(
    review: Action, finance: Any, frozen: FrozenClock
) -> None:
    from actions.providers.base import NotFoundError

    sent_at(review, frozen.instant)
    live, _ = receiver(find_error=NotFoundError("No such charge", code="resource_missing", http_status=404))
    resolutions.action_resolve_failed(action_pk=review.pk, user=finance, reason="r", remedy_kind="none", receiver=live)
    assert Action.objects.get(pk=review.pk).status == S.FAILED_FINAL


def test_where_the_receiver_cannot_be_asked_failed_is_the_persons_word(
    review: Action, finance: Any, frozen: FrozenClock
) -> None:
    sent_at(review, frozen.instant)
    live, fake = receiver(provider=NO_LOOKUP_NO_KEYS)
    resolution = resolutions.action_resolve_failed(
        action_pk=review.pk, user=finance, reason="r", remedy_kind="cheque", receiver=live
    )
    assert fake.calls == []
    assert resolution.outcome == S.FAILED_FINAL


@pytest.mark.parametrize(
    ("planted", "error", "message"),
    [
        (
            (("re_a", RefundStatus.SUCCEEDED),),
            None,
            "The provider shows re_a (succeeded) for this action: the refund exists, so it cannot be recorded as "
            "failed. Confirm it as succeeded, or wait for it to settle.",
        ),
        (
            (("re_a", RefundStatus.PENDING), ("re_b", RefundStatus.FAILED)),
            None,
            "The provider shows re_a (pending) for this action: the refund exists, so it cannot be recorded as "
            "failed. Confirm it as succeeded, or wait for it to settle.",
        ),
        ((), ProviderError("timeout"), "The provider could not be asked (timeout). Try again in a moment."),
    ],
    ids=["succeeded", "pending", "inconclusive"],
)
def test_failed_is_refused_when_the_receiver_shows_the_refund_or_cannot_be_asked(
    review: Action, finance: Any, frozen: FrozenClock, settings: Any, planted: Any, error: Any, message: str
) -> None:
    review = quiet(review, frozen, settings, extra=timedelta(days=1))
    live, _ = receiver(*(at_provider(review, ref, status) for ref, status in planted), find_error=error)
    before = snapshot(review)
    problem = refused(
        lambda: resolutions.action_resolve_failed(
            action_pk=review.pk, user=finance, reason="r", remedy_kind="cheque", receiver=live
        )
    )
    assert (str(problem), problem.code) == (message, "provider_disagrees")
    assert snapshot(review) == before
    assert len(lookup_rows(review)) == 1


def test_a_not_found_proves_failure_only_once_the_last_attempt_can_no_longer_arrive(
    review: Action, finance: Any, frozen: FrozenClock, settings: Any
) -> None:
    """Quiet from last send + lease + visibility delay, to the microsecond; the *last* send counts."""
    settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS = 30
    from actions.kinds.refund.contract import provider_from_settings

    provider_from_settings.cache_clear()
    delay = timedelta(seconds=30)
    live, _ = receiver(provider=guarantees(keys=True, lookup=True, authoritative=True, visibility=delay))
    lease = timedelta(seconds=settings.LEASE_SECONDS)
    last = frozen.instant - lease - delay + timedelta(microseconds=1)
    sent_at(review, last, first=frozen.instant - timedelta(days=2))

    problem = refused(
        lambda: resolutions.action_resolve_failed(
            action_pk=review.pk, user=finance, reason="r", remedy_kind="cheque", receiver=live
        )
    )
    assert str(problem) == (
        f"The last attempt ({last:%H:%M:%S}) could still reach the provider until "
        f"{last + lease + delay:%H:%M:%S}: record it as failed after that, once a lookup still finds nothing."
    )
    assert problem.code == "provider_disagrees"

    sent_at(review, last - timedelta(microseconds=1), first=frozen.instant - timedelta(days=2))
    resolutions.action_resolve_failed(
        action_pk=review.pk, user=finance, reason="r", remedy_kind="cheque", receiver=live
    )
    assert Action.objects.get(pk=review.pk).status == S.FAILED_FINAL


def test_a_not_found_inside_the_visibility_delay_is_too_early_to_prove_anything(
    review: Action, finance: Any, frozen: FrozenClock
) -> None:
    delay = timedelta(hours=1)
    live, _ = receiver(provider=guarantees(keys=True, lookup=True, authoritative=True, visibility=delay))
    last = frozen.instant - delay + timedelta(microseconds=1)
    sent_at(review, last)
    problem = refused(
        lambda: resolutions.action_resolve_failed(
            action_pk=review.pk, user=finance, reason="r", remedy_kind="cheque", receiver=live
        )
    )
    assert str(problem) == (
        f"The provider's lookup may still be catching up until {last + delay:%H:%M:%S}. Try again then."
    )


def test_a_not_found_from_lookups_that_are_not_authoritative_proves_nothing(
    review: Action, finance: Any, frozen: FrozenClock, settings: Any
) -> None:
    quiet(review, frozen, settings, extra=timedelta(days=1))
    live, _ = receiver(provider=guarantees(keys=True, lookup=True, authoritative=False))
    problem = refused(
        lambda: resolutions.action_resolve_failed(
            action_pk=review.pk, user=finance, reason="r", remedy_kind="cheque", receiver=live
        )
    )
    assert str(problem) == (
        "The provider's lookups are not authoritative: a not-found answer does not prove a retry is safe."
    )


def test_failed_checks_the_state_before_asking_and_asks_nobody_for_an_unknown_action(
    agent_actor: Actor, finance: Any
) -> None:
    action = unknown(agent_actor)
    live, fake = receiver()
    problem = refused(
        lambda: resolutions.action_resolve_failed(
            action_pk=action.pk, user=finance, reason="r", remedy_kind="cheque", receiver=live
        )
    )
    assert (str(problem), problem.code, problem.status) == (
        f"{action.action_id} is unknown now, not waiting for review. Reload the page to see what happened.",
        "not_needs_review",
        409,
    )
    assert fake.calls == []


# --- retried with the same key -----------------------------------------------------------------------


def looked_up(action: Action, finance: Any, live: RefundReceiver) -> Attempt:
    return resolutions.action_lookup(action_pk=action.pk, user=finance, receiver=live).attempt


def test_a_retry_after_a_fresh_not_found_sends_once_more_with_the_same_key(
    review: Action, finance: Any, settings: Any
) -> None:
    live, fake = receiver()
    evidence = looked_up(review, finance, live)

    resolution = resolutions.action_resolve_retry(
        action_pk=review.pk, user=finance, reason=" Not there; send it. ", receiver=live
    )

    assert fake.calls == ["find_refunds", "find_refunds", "create_refund"]
    action = Action.objects.get(pk=review.pk)
    assert (action.status, action.provider_reference) == (S.SUCCEEDED, "re_fake_1")
    assert money(action) == (Decimal("20.00"), Decimal("0.00"))
    check = lookup_rows(review)[-1]
    assert (check.request["purpose"], check.outcome) == ("check before retrying", "not_found")
    retry = ActionEvent.objects.get(action=review, transition="resolve_retry")
    assert (retry.from_state, retry.to_state, retry.actor_user) == (S.NEEDS_REVIEW, S.SUBMITTING, finance)
    assert retry.reason == "Not there; send it."
    assert retry.evidence == {
        "lease_expires_at": (retry.created_at + timedelta(seconds=settings.LEASE_SECONDS)).isoformat(),
        "resolution": "retry",
        "idempotency_key": review.idempotency_key,
        "evidence_attempt_id": evidence.pk,
        "check_attempt_id": check.pk,
        "provider_answer": "not_found",
    }
    submits = list(Attempt.objects.filter(action=review, kind=AttemptKind.SUBMIT).order_by("pk"))
    assert [s.idempotency_key for s in submits] == [review.idempotency_key] * 2
    assert (resolution.outcome, resolution.check, resolution.action.status) == (S.SUCCEEDED, check, S.SUCCEEDED)
    assert resolution.message == (
        f"{review.action_id} was sent again with the same key {review.idempotency_key}. It is succeeded now."
    )


def test_another_actions_fresh_not_found_is_no_evidence_for_this_one(
    agent_actor: Actor, review: Action, finance: Any
) -> None:
    other = escalated(agent_actor, owner=finance)
    live, fake = receiver()
    looked_up(other, finance, live)
    fake.calls.clear()

    problem = refused(
        lambda: resolutions.action_resolve_retry(action_pk=review.pk, user=finance, reason="r", receiver=live)
    )

    assert problem.code == "no_recent_not_found"
    assert fake.calls == []


def test_a_retry_without_a_lookup_or_after_a_found_one_is_refused_before_anyone_is_asked(
    review: Action, finance: Any
) -> None:
    live, fake = receiver()
    problem = refused(
        lambda: resolutions.action_resolve_retry(action_pk=review.pk, user=finance, reason="r", receiver=live)
    )
    assert (str(problem), problem.code) == (
        "Look the action up at the provider first: a retry needs a not-found answer from the last 5 min.",
        "no_recent_not_found",
    )
    assert fake.calls == []

    looked_up(review, finance, live)  # not found
    fake.refunds.append(at_provider(review, "re_late"))
    looked_up(review, finance, live)  # found, and newer
    fake.calls.clear()
    problem = refused(
        lambda: resolutions.action_resolve_retry(action_pk=review.pk, user=finance, reason="r", receiver=live)
    )
    assert str(problem) == (
        "The latest lookup did not say 'not found', so the effect may exist: a retry could repeat it."
    )
    assert fake.calls == []


def test_the_latest_finished_lookup_decides_whatever_the_row_order(review: Action, finance: Any) -> None:
    """Ordered by when each lookup finished, not by row: a not-found that finished after a found
    one decides, and a lookup still running (no finish time) is no evidence either way."""
    live, fake = receiver()
    not_found = looked_up(review, finance, live)
    fake.refunds.append(at_provider(review, "re_seen"))
    found = looked_up(review, finance, live)
    assert found.finished_at is not None
    Attempt.objects.filter(pk=not_found.pk).update(finished_at=found.finished_at + timedelta(seconds=1))
    Attempt.objects.create(
        action=review,
        kind=AttemptKind.LOOKUP,
        idempotency_key=review.idempotency_key,
        outcome="found",
        request={},
        started_at=timezone.now(),
    )
    fake.refunds.clear()
    fake.calls.clear()
    resolutions.action_resolve_retry(action_pk=review.pk, user=finance, reason="r", receiver=live)
    assert fake.calls == ["find_refunds", "create_refund"]
    retry = ActionEvent.objects.get(action=review, transition="resolve_retry")
    assert retry.evidence["evidence_attempt_id"] == not_found.pk


def test_of_two_lookups_finished_at_one_instant_the_later_row_decides(review: Action, finance: Any) -> None:
    live, fake = receiver()
    first = looked_up(review, finance, live)
    fake.refunds.append(at_provider(review, "re_seen"))
    second = looked_up(review, finance, live)
    Attempt.objects.filter(pk=first.pk).update(finished_at=second.finished_at)
    problem = refused(
        lambda: resolutions.action_resolve_retry(action_pk=review.pk, user=finance, reason="r", receiver=live)
    )
    assert problem.code == "no_recent_not_found"


@pytest.mark.parametrize(
    ("planted", "error", "message"),
    [
        (
            (("re_a", RefundStatus.SUCCEEDED),),
            None,
            "The provider shows re_a (succeeded) for this action: the refund exists, so it cannot be retried. "
            "Confirm it as succeeded, or wait for it to settle.",
        ),
        (
            (("re_a", RefundStatus.FAILED),),
            None,
            "The provider has records for this action (re_a (failed)): a retry is not safe.",
        ),
        ((), ProviderError("timeout"), "The provider could not be asked (timeout). Try again in a moment."),
    ],
    ids=["appeared", "a-failed-record", "inconclusive"],
)
def test_a_retry_is_refused_when_the_receiver_now_shows_anything_or_cannot_be_asked(
    review: Action, finance: Any, planted: Any, error: Any, message: str
) -> None:
    live, fake = receiver()
    looked_up(review, finance, live)
    fake.refunds.extend(at_provider(review, ref, status) for ref, status in planted)
    fake.find_error = error
    before = snapshot(review)
    problem = refused(
        lambda: resolutions.action_resolve_retry(action_pk=review.pk, user=finance, reason="r", receiver=live)
    )
    assert (str(problem), problem.code) == (message, "provider_disagrees")
    assert snapshot(review) == before
    assert "create_refund" not in fake.calls


def test_a_missing_charge_does_not_make_a_retry_safe(review: Action, finance: Any) -> None:
    from actions.providers.base import NotFoundError

    live, fake = receiver()
    looked_up(review, finance, live)
    fake.find_error = NotFoundError("No such charge", code="resource_missing")
    problem = refused(
        lambda: resolutions.action_resolve_retry(action_pk=review.pk, user=finance, reason="r", receiver=live)
    )
    assert (
        str(problem)
        == "The provider could not be asked (No such charge (code=resource_missing)). Try again in a moment."
    )


def test_a_retry_needs_a_receiver_that_can_be_asked_and_is_past_its_visibility_delay(
    review: Action, finance: Any, frozen: FrozenClock
) -> None:
    live, fake = receiver()
    looked_up(review, finance, live)
    fake.calls.clear()

    unaskable, _ = receiver(provider=NO_LOOKUP_NO_KEYS)
    problem = refused(
        lambda: resolutions.action_resolve_retry(action_pk=review.pk, user=finance, reason="r", receiver=unaskable)
    )
    assert str(problem) == "The provider offers no lookup, so nothing can prove that sending again would not repeat it."

    looked_up(review, finance, live)  # the refused retry's own check ("no_lookup") is now the latest
    unreliable, _ = receiver(provider=guarantees(keys=True, lookup=True, authoritative=False))
    problem = refused(
        lambda: resolutions.action_resolve_retry(action_pk=review.pk, user=finance, reason="r", receiver=unreliable)
    )
    assert str(problem) == (
        "The provider's lookups are not authoritative: a not-found answer does not prove a retry is safe."
    )

    looked_up(review, finance, live)
    delay = timedelta(minutes=10)
    slow, slow_fake = receiver(provider=guarantees(keys=True, lookup=True, authoritative=True, visibility=delay))
    last = frozen.instant - delay + timedelta(microseconds=1)
    sent_at(review, last, first=frozen.instant - timedelta(days=1))
    Attempt.objects.filter(action=review, kind=AttemptKind.LOOKUP).update(finished_at=timezone.now())
    problem = refused(
        lambda: resolutions.action_resolve_retry(action_pk=review.pk, user=finance, reason="r", receiver=slow)
    )
    assert (
        str(problem) == f"The provider's lookup may still be catching up until {last + delay:%H:%M:%S}. Try again then."
    )
    assert "create_refund" not in slow_fake.calls

    sent_at(review, last - timedelta(microseconds=1), first=frozen.instant - timedelta(days=1))
    Attempt.objects.filter(action=review, kind=AttemptKind.LOOKUP).update(finished_at=timezone.now())
    resolutions.action_resolve_retry(action_pk=review.pk, user=finance, reason="r", receiver=slow)
    assert slow_fake.calls == ["find_refunds", "find_refunds", "create_refund"], "refused once, then sent"


def test_the_visibility_delay_counts_from_the_first_send_when_no_last_one_is_recorded(
    review: Action, finance: Any, frozen: FrozenClock
) -> None:
    delay = timedelta(minutes=10)
    slow, _ = receiver(provider=guarantees(keys=True, lookup=True, authoritative=True, visibility=delay))
    first = frozen.instant - delay + timedelta(microseconds=1)
    Action.objects.filter(pk=review.pk).update(last_attempt_at=None, first_attempt_at=first)
    problem = refused(
        lambda: resolutions.action_resolve_failed(
            action_pk=review.pk, user=finance, reason="r", remedy_kind="cheque", receiver=slow
        )
    )
    assert (
        str(problem)
        == f"The provider's lookup may still be catching up until {first + delay:%H:%M:%S}. Try again then."
    )


# --- sent again to a receiver that can be neither asked nor deduplicated ---------------------------------


def test_a_resend_is_a_recorded_decision_to_risk_a_repeat(review: Action, finance: Any, settings: Any) -> None:
    live, fake = receiver(provider=NO_LOOKUP_NO_KEYS)

    resolution = resolutions.action_resolve_resend(
        action_pk=review.pk, user=finance, reason=" The supplier never replied. ", receiver=live
    )

    assert fake.calls == ["create_refund"]
    [check] = lookup_rows(review)
    assert (check.request["purpose"], check.outcome) == ("before sending again", "no_lookup")
    event = ActionEvent.objects.get(action=review, transition="resolve_resend")
    assert (event.from_state, event.to_state, event.actor_user) == (S.NEEDS_REVIEW, S.SUBMITTING, finance)
    assert event.reason == "Send again, knowing a duplicate may reach the provider: The supplier never replied."
    assert event.evidence == {
        "lease_expires_at": (event.created_at + timedelta(seconds=settings.LEASE_SECONDS)).isoformat(),
        "resolution": "resend",
        "possible_duplicate": True,
        "earlier_attempts": 1,
        "check_attempt_id": check.pk,
        "provider_answer": "no_lookup",
    }
    assert (resolution.outcome, resolution.check) == (S.SUCCEEDED, check)
    assert (resolution.action.pk, resolution.action.status) == (review.pk, S.SUCCEEDED)
    assert resolution.message == f"{review.action_id} was sent again, marked as a possible repeat. It is succeeded now."


@pytest.mark.parametrize(
    "provider",
    [guarantees(keys=True, lookup=False, authoritative=False), guarantees(keys=False, lookup=True, authoritative=True)],
    ids=["keys", "lookup"],
)
def test_a_resend_is_refused_for_a_receiver_that_can_be_asked(
    review: Action, finance: Any, provider: ProviderGuarantees
) -> None:
    live, fake = receiver(provider=provider)
    before = snapshot(review)
    problem = refused(
        lambda: resolutions.action_resolve_resend(action_pk=review.pk, user=finance, reason="r", receiver=live)
    )
    assert (str(problem), problem.code) == (
        "The provider can be asked: look it up and retry with the same key instead.",
        "receiver_can_be_asked",
    )
    assert fake.calls == []
    assert snapshot(review) == before
    assert lookup_rows(review) == []


def test_a_resend_needs_a_reason_and_a_review(agent_actor: Actor, review: Action, finance: Any) -> None:
    live, fake = receiver(provider=NO_LOOKUP_NO_KEYS)
    assert (
        refused(
            lambda: resolutions.action_resolve_resend(action_pk=review.pk, user=finance, reason=" ", receiver=live)
        ).field
        == "reason"
    )
    other = unknown(agent_actor)
    assert (
        refused(
            lambda: resolutions.action_resolve_resend(action_pk=other.pk, user=finance, reason="r", receiver=live)
        ).code
        == "not_needs_review"
    )
    assert fake.calls == []


# --- taking an unknown action over -----------------------------------------------------------------------


def test_taking_an_unknown_action_over_escalates_it_to_me_with_the_policys_due_time(
    agent_actor: Actor, finance: Any, frozen: FrozenClock, settings: Any
) -> None:
    action = unknown(agent_actor)

    taken = resolutions.action_escalate_to_user(action_pk=action.pk, user=finance, reason=" Customer calling. ")

    due = frozen.instant + timedelta(hours=settings.REVIEW_DUE_HOURS)
    fresh = Action.objects.get(pk=action.pk)
    assert (fresh.status, fresh.owner, fresh.due_at, fresh.next_reconcile_at) == (S.NEEDS_REVIEW, finance, due, None)
    assert taken.pk == action.pk and taken.status == S.NEEDS_REVIEW
    event = last_event(action)
    assert (event.transition, event.actor_user, event.created_at) == ("escalate", finance, frozen.instant)
    assert event.reason == "Taken over by fiona.finance from the review queue: Customer calling."
    assert event.evidence == {"owner": "fiona.finance", "due_at": due.isoformat(), "source": "review queue"}


def test_taking_over_without_a_note_says_it_came_before_the_policys_limit(agent_actor: Actor, finance: Any) -> None:
    action = unknown(agent_actor)
    resolutions.action_escalate_to_user(action_pk=action.pk, user=finance)
    assert last_event(action).reason == (
        "Taken over by fiona.finance from the review queue before the escalation policy's limit."
    )


def test_only_finance_takes_over_only_an_unknown_action_and_only_its_own(
    agent_actor: Actor, review: Action, finance: Any, manager: Any, felix: Any, settings: Any
) -> None:
    action = unknown(agent_actor)
    problem = refused(lambda: resolutions.action_escalate_to_user(action_pk=action.pk, user=manager))
    assert (str(problem), problem.status) == ("Only finance may take an action over for review.", 403)
    problem = refused(lambda: resolutions.action_escalate_to_user(action_pk=review.pk, user=finance))
    assert (str(problem), problem.code) == (
        f"{review.action_id} is needs review, not unknown: only an unknown action can be taken over before the "
        "escalation policy hands it on.",
        "not_unknown",
    )
    assert (
        refused(lambda: resolutions.action_escalate_to_user(action_pk=action.pk, user=finance, reason="\x00")).field
        == "reason"
    )
    settings.REVIEW_OWNERS_ONLY = True
    Action.objects.filter(pk=action.pk).update(owner=felix)
    assert refused(lambda: resolutions.action_escalate_to_user(action_pk=action.pk, user=finance)).code == "not_owner"
    assert Action.objects.get(pk=action.pk).status == S.UNKNOWN


def test_taking_over_locks_the_row_so_a_concurrent_record_waits_for_it(agent_actor: Actor, finance: Any) -> None:
    """The status check and the escalation happen under a row lock: a reconciler recording an
    answer at the same moment cannot slip in between them (it waits, then finds NEEDS_REVIEW)."""
    action = unknown(agent_actor)
    with CaptureQueriesContext(connection) as queries:
        resolutions.action_escalate_to_user(action_pk=action.pk, user=finance)
    reads = [q["sql"] for q in queries.captured_queries if q["sql"].startswith('SELECT "actions_action"')]
    assert reads and reads[0].endswith('FOR UPDATE OF "actions_action"'), reads
