"""Money and keys at the console's edge: what the receiver gets is what the console means.

- Amounts leave the console in the receiver's minor units through one function that knows
  zero-decimal currencies: 2500 JPY goes out as ``2500``, 12.34 EUR as ``1234``. Checked against
  the amount the sandbox stored, not against the function itself.
- The idempotency key is the action id and must fit the receiver's limit of 255 characters
  (docs/architecture.md section 3): 255 is accepted by the console's check and by the sandbox, 256 by
  neither. The console composes action ids that always fit: order numbers are capped at 32
  characters and request numbers at 1,000,000.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actions.engine.dispatch import execution_dispatch
from actions.kinds.fields import REFERENCE_PATTERN, ProposalInvalid
from actions.kinds.refund.contract import refund_action_id
from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionStatus
from actions.providers.base import IDEMPOTENCY_KEY_MAX_LENGTH, CreateRefund, validate_idempotency_key
from actions.providers.money import from_minor_units, to_minor_units
from actions.providers.stripe_adapter import StripeProvider
from actions.services import Actor
from tests.factories import make_order, make_request
from tests.providers.sandbox_client import API_KEY, SandboxClient

S = ActionStatus

MAX_REQUEST_NUMBER = 1_000_000
KEY_255 = ("refund:order-4821:request-3:" + "k" * IDEMPOTENCY_KEY_MAX_LENGTH)[:IDEMPOTENCY_KEY_MAX_LENGTH]
KEY_256 = KEY_255 + "k"


@pytest.fixture
def charge(live_sandbox: SandboxClient) -> str:
    live_sandbox.seed_charge("ch_keys", 10000, "eur")
    return "ch_keys"


@pytest.fixture
def provider(live_sandbox: SandboxClient) -> StripeProvider:
    """The production adapter, pointed at the sandbox."""
    return StripeProvider(api_key=API_KEY, api_base=live_sandbox.url, timeout_seconds=2)


def refund_with_key(key: str, charge: str) -> CreateRefund:
    return CreateRefund(
        idempotency_key=key, charge=charge, amount_minor=500, currency="eur", metadata={"action_id": key}
    )


# --- minor units, as the receiver received them -----------------------------------------------


@pytest.mark.postgres
@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("currency", "captured", "amount", "minor"),
    [
        ("JPY", "10000", "2500", 2500),  # zero-decimal: whole yen, not 250000
        ("EUR", "100.00", "12.34", 1234),  # cents
    ],
)
def test_the_receiver_gets_the_amount_in_its_minor_units(
    live_sandbox: SandboxClient,
    agent_actor: Actor,
    dispatched: list[int],
    currency: str,
    captured: str,
    amount: str,
    minor: int,
) -> None:
    """Invariants 2 and 5: the refund the sandbox stored is exactly the console's amount, so the
    order's refunded total and the receiver's ledger agree."""
    order = make_order(currency=currency, captured=captured)
    live_sandbox.seed_charge(order.charge_reference, to_minor_units(Decimal(captured), currency), currency.lower())
    request = make_request(order)
    proposal = action_propose_refund(
        order_number=order.number,
        request_number=request.number,
        amount=amount,
        currency=currency,
        reason_code="damaged",
        proposer=agent_actor,
    )
    assert proposal.action.status == S.AUTHORIZED, "auto-approved below the currency's threshold"

    assert execution_dispatch(action_pk=proposal.action.pk) == S.SUCCEEDED

    [refund] = live_sandbox.ledger()
    assert (refund["amount"], refund["currency"]) == (minor, currency.lower())
    assert from_minor_units(refund["amount"], refund["currency"]) == Decimal(amount)
    action = Action.objects.select_related("order").get(pk=proposal.action.pk)
    assert action.provider_reference == refund["id"]
    assert action.order is not None and action.order.refunded_amount == Decimal(amount)


# --- the key's length limit --------------------------------------------------------------------


def test_a_key_of_255_characters_passes_the_consoles_check() -> None:
    """Invariant 4: the key stored at the proposal is the key every attempt sends, so it must
    be acceptable to the receiver from the start."""
    assert len(KEY_255) == IDEMPOTENCY_KEY_MAX_LENGTH == 255
    validate_idempotency_key(KEY_255)


def test_a_key_of_256_characters_is_refused_by_the_consoles_check_naming_the_limit() -> None:
    """Invariant 11: a key the receiver would refuse is refused here first, with the limit named."""
    with pytest.raises(ValueError, match="256 characters long; the limit is 255"):
        validate_idempotency_key(KEY_256)


@pytest.mark.processes
def test_the_sandbox_accepts_a_key_of_255_characters_and_refuses_256(live_sandbox: SandboxClient, charge: str) -> None:
    """Invariant 1: the sandbox holds keys to Stripe's limit, so a key the console accepts is
    one the receiver deduplicates on; one character more is refused before anything happens."""
    accepted = live_sandbox.post_refund(key=KEY_255, charge=charge, amount=500, metadata={"action_id": "a"})
    replayed = live_sandbox.post_refund(key=KEY_255, charge=charge, amount=500, metadata={"action_id": "a"})
    refused = live_sandbox.post_refund(key=KEY_256, charge=charge, amount=500, metadata={"action_id": "b"})

    assert accepted.status_code == 200
    assert replayed.headers.get("Idempotent-Replayed") == "true"
    assert replayed.json()["id"] == accepted.json()["id"]
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "Idempotency-Key"
    assert [r["id"] for r in live_sandbox.ledger()] == [accepted.json()["id"]]


@pytest.mark.processes
def test_the_adapter_sends_a_255_character_key_and_never_sends_a_256_character_one(
    live_sandbox: SandboxClient, charge: str, provider: StripeProvider
) -> None:
    """Invariants 1 and 3: through the production adapter, 255 reaches the receiver and is
    stored with the refund; 256 fails before any request leaves the process."""
    refund = provider.create_refund(refund_with_key(KEY_255, charge))

    with pytest.raises(ValueError, match="the limit is 255"):
        provider.create_refund(refund_with_key(KEY_256, charge))

    [stored] = live_sandbox.ledger()
    assert stored["id"] == refund.id
    assert stored["sandbox"]["idempotency_key"] == KEY_255


# --- action ids the console composes --------------------------------------------------------------


def test_the_longest_action_id_the_console_can_compose_is_within_the_key_limit() -> None:
    """Invariant 4: the longest order number and request number still make a valid key."""
    longest = refund_action_id(order_number="9" * 32, request_number=MAX_REQUEST_NUMBER)

    assert longest == f"refund:order-{'9' * 32}:request-1000000"
    assert len(longest) <= IDEMPOTENCY_KEY_MAX_LENGTH
    validate_idempotency_key(longest)


@given(
    order_number=st.from_regex(REFERENCE_PATTERN, fullmatch=True),
    request_number=st.integers(min_value=1, max_value=MAX_REQUEST_NUMBER),
)
def test_every_action_id_composed_from_accepted_references_is_a_valid_key(
    order_number: str, request_number: int
) -> None:
    """Invariant 4: whatever references validation lets through, the composed action id is a
    key every receiver accepts, so no proposal can fail at the receiver because of its key."""
    action_id = refund_action_id(order_number=order_number, request_number=request_number)

    validate_idempotency_key(action_id)
    assert order_number in action_id


@pytest.mark.django_db
def test_a_proposal_for_an_order_number_of_32_characters_gets_its_action_id_as_key(
    agent_actor: Actor, dispatched: list[int]
) -> None:
    """Invariant 4: the action id and the idempotency key are one value, composed in the limit."""
    order = make_order(number="A" * 32)
    make_request(order, 1)

    action = action_propose_refund(
        order_number=order.number,
        request_number=1,
        amount="10.00",
        currency="EUR",
        reason_code="damaged",
        proposer=agent_actor,
    ).action

    assert action.action_id == action.idempotency_key == f"refund:order-{'A' * 32}:request-1"
    validate_idempotency_key(action.idempotency_key)


@pytest.mark.django_db
def test_an_order_number_of_33_characters_is_refused_naming_the_field(
    agent_actor: Actor, dispatched: list[int]
) -> None:
    """Invariant 11: a reference longer than the cap is bad input, refused before anything is
    written, with the field named."""
    with pytest.raises(ProposalInvalid) as refused:
        action_propose_refund(
            order_number="A" * 33,
            request_number=1,
            amount="10.00",
            currency="EUR",
            reason_code="damaged",
            proposer=agent_actor,
        )

    assert [problem.field for problem in refused.value.problems] == ["order_number"]
    assert not Action.objects.exists()
