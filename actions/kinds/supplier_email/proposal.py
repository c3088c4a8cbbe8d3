"""The supplier email's proposal service: validate, render the template, record
(docs/architecture.md section 3).

The checks and the rendering are in ``actions.kinds.supplier_email.checks``; the composing and
recording, shared by every kind, is ``actions.services.ProposalDraft``. Bad input raises
ProposalInvalid naming the field and writes nothing.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db import transaction

from actions.foundation.clock import database_clock_now
from actions.foundation.trail import Actor
from actions.kinds.supplier_email.checks import email_fields_check, email_payload, supplier_contact_resolve
from actions.kinds.supplier_email.contract import supplier_email_action_id
from actions.services import ProposalDraft, ProposalResult, answers_a_lost_proposal_race


@answers_a_lost_proposal_race
def supplier_email_propose(
    *,
    supplier: object,
    reference: object,
    template: object,
    parameters: object,
    to: object,
    evidence: object = "",
    proposer: Actor,
    now: datetime | None = None,
) -> ProposalResult:
    """Validate a supplier email deterministically, render it and record the proposal.

    The same action id with the same rendered message returns the existing action; with a
    different one (other parameters, another template version, another address) it is a
    conflict. A manager always decides: an email moves no money, and no policy reads it.
    """
    now = now or database_clock_now()
    fields = email_fields_check(
        supplier=supplier, reference=reference, template=template, parameters=parameters, to=to, evidence=evidence
    )
    with transaction.atomic(durable=True):
        target = supplier_contact_resolve(fields)
        action_id = supplier_email_action_id(
            supplier=target.code, reference=fields.reference, template=fields.template.name
        )
        draft = ProposalDraft.compose(action_id, email_payload(target, fields, action_id=action_id))
        # An email moves no money: no amount, no currency and no reason code.
        return draft.existing_or_record(
            proposer,
            now=now,
            evidence=fields.evidence,
            reason=f"Rendered from template {fields.template.name} version {fields.template.version}.",
            amount=Decimal("0"),
            currency="",
            reason_code="",
        )
