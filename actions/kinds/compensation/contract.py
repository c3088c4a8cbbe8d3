"""The compensation kind: recovering money that the receiver paid out twice.

A duplicate refund found by the ledger audit is recovered outside any API (an invoice to the
customer, a bank's recall), so this kind's receiver is a person in finance. Dispatching an
approved compensation hands it to the owner group at once, with a due time; finance records the
recovery ("recovery recorded", with the evidence's reference) or that it failed. Nothing is sent
to the payment provider, and nothing is ever re-sent automatically (invariant 16).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

from actions.kinds.base import (
    Answer,
    Effect,
    EffectKind,
    Explanations,
    LedgerWindow,
    Lookup,
    LookupVerdict,
    Outcome,
    ReceiverContract,
    StepClass,
)
from actions.models import Action, ActionKind


class RecoveryIsManual(Exception):
    """Not an error of a receiver: the recovery is a person's work, recorded by finance."""

    code = "manual_recovery"
    http_status = None
    raw = None

    def __init__(self) -> None:
        self.message = "The recovery is done by a person in finance, who records it with its evidence."
        super().__init__(self.message)


class FinanceDesk:
    """A receiver that is a person: no keys, no lookup. Every send goes to finance's queue."""

    contract = ReceiverContract(
        receiver="finance desk",
        honours_keys=False,
        key_retention=None,
        supports_lookup=False,
        lookup_authoritative=False,
        lookup_visibility_delay=timedelta(0),
        can_settle_later=False,
        step_class=StepClass.IRREVERSIBLE,
        correction_path="Finance records the recovery with its evidence, or that it failed, with a reason.",
    )

    def send(self, action: Action) -> Answer:
        return Answer(outcome=Outcome.NEEDS_REVIEW, error=RecoveryIsManual())

    def lookup(self, action: Action) -> Lookup:
        return Lookup(LookupVerdict.INCONCLUSIVE, error=RecoveryIsManual())

    def ledger(self, window: LedgerWindow | None = None) -> Iterator[Effect]:
        return iter(())


class CompensationKind(EffectKind):
    name = ActionKind.COMPENSATION.value
    label = "Compensation"
    correction_followup = "Recovering the money is a manual step for finance."
    explanations = Explanations(
        noun="recovery",
        succeeded="Finance recorded the recovery.",
        pending="The recovery is under way.",
        failed="The recovery did not and will not happen",
        on_failure="The duplicate stays on record as a discrepancy for finance to explain.",
    )
    id_pattern = "compensation:<the duplicate effect's reference>"
    example_action_id = "compensation:re_3Nq2kL"
    binds = "amount, currency, payload hash and expiry (it draws on no balance)"
    has_ledger = False

    def receiver(self) -> FinanceDesk:
        return FinanceDesk()

    def target_label(self, action: Action) -> str:
        return f"duplicate of {action.payload.get('compensates', '-')}"


def compensation_action_id(*, duplicate_reference: str) -> str:
    """The compensation names the refund it recovers: one duplicate refund, one compensation."""
    return f"{ActionKind.COMPENSATION}:{duplicate_reference}"
