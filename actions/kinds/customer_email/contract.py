"""The customer-email kind: a notice to an order's customer, sent as a workflow's last step.

Same receiver as the supplier email (the mail relay: no keys, no lookup, irreversible), so the
same contract and the same consequences: an ambiguous send goes to a named person at once and is
never re-sent without a person's recorded decision (invariant 16). Only a workflow creates one
(``refund_with_notice``); its text is rendered from a fixed template with the order's own data
and the plan's approved amount, never with an agent's words.

The target is the order; the approval binds no order version (the refund step before it bumps
that version by design). The claim checks instead that the address is still the order's
customer's, which the payload hash fixes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from actions.kinds.base import BindingFailure, EffectKind, ReceiverContract
from actions.kinds.supplier_email.contract import CONTRACT, MailRelay, SupplierEmailKind, message_reference
from actions.models import Action, ActionKind, Order


class CustomerEmailKind(EffectKind):
    name = ActionKind.CUSTOMER_EMAIL.value
    label = "Customer email"
    owner_group = "finance"
    # The supplier email's relay, in the same words, but for who has not been told.
    explanations = replace(
        SupplierEmailKind.explanations,
        on_failure="Nothing was sent; the customer has not been told. A person decides whether to write by hand.",
    )
    id_pattern = "<workflow id>:<step> (only as a workflow's step)"
    example_action_id = "refund-notice:order-4821:request-1:notify_customer"
    binds = "the customer's address (through the payload hash) and expiry"
    moves_money = False
    # The relay keeps one list of accepted messages for every kind that sends mail; the supplier
    # email kind's audit reads it and matches each message to its action by id, whatever its kind.
    has_ledger = False
    resolutions = ("succeeded", "resend", "failed")
    confirmation_needs_evidence = True
    resolution_labels = SupplierEmailKind.resolution_labels
    answer_table = SupplierEmailKind.answer_table

    def receiver(self) -> MailRelay:
        return SupplierEmailKind().receiver()

    def contract(self) -> ReceiverContract:
        return CONTRACT

    def request_body(self, action: Action) -> dict[str, Any]:
        return SupplierEmailKind().request_body(action)

    def lookup_request(self, action: Action) -> dict[str, Any]:
        return {"message_id": action.payload.get("message_id"), "action_id": action.action_id}

    def target_label(self, action: Action) -> str:
        return f"customer of order {action.payload.get('order', '-')} ({action.payload.get('to', '-')})"

    def message_preview(self, action: Action) -> dict[str, str] | None:
        return SupplierEmailKind().message_preview(action)

    def default_reference(self, action: Action) -> str:
        return message_reference(action.action_id)

    def auto_approval_refusal(self, action: Action) -> str | None:
        # The text is the console's fixed template filled with the order's data and the plan's
        # approved amount: nothing in it was written by an agent.
        return None

    def _address_problem(self, action: Action) -> str | None:
        order = Order.objects.filter(number=action.payload.get("order")).first()
        if order is None:
            return f"There is no order {action.payload.get('order')} any more."
        if (order.customer_email or "").lower() != str(action.payload.get("to", "")).lower():
            return f"{action.payload.get('to')} is no longer the address of order {order.number}'s customer."
        return None

    def approval_refusal(self, action: Action) -> tuple[str, str] | None:
        problem = self._address_problem(action)
        return ("unknown_contact", problem) if problem else None

    def reserve(self, action: Action, *, approved_version: int | None) -> list[BindingFailure]:
        problem = self._address_problem(action)
        return [BindingFailure("contact", problem)] if problem else []
