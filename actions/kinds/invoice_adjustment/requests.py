"""Adjustment requests: the accounts-payable matcher's exception on a bill, opened before a proposal.

A request is numbered per bill (adjustment-1, adjustment-2...) and that number becomes part of
the action id of the adjustment proposed for it. Opening one is idempotent by its external
reference (the matcher's exception id): a retry returns the request that exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Max

from actions.kinds.fields import FieldProblem, ProposalInvalid, check_external_reference, check_note, check_reference
from actions.models import AdjustmentRequest, Agent, Bill


class AdjustmentRequestConflict(Exception):
    """The external reference already names an adjustment request on another bill."""

    def __init__(self, request: AdjustmentRequest, differing: dict[str, dict[str, Any]]) -> None:
        self.request = request
        self.differing = differing
        super().__init__(
            f"The external reference {request.external_reference!r} already belongs to an adjustment request on "
            f"bill {request.bill.number}. One mismatch is one request: use another reference for another bill."
        )


class AdjustmentRequestTaken(Exception):
    """The external reference names a request another agent opened. Nothing is revealed about it."""


@dataclass(frozen=True)
class AdjustmentRequestResult:
    request: AdjustmentRequest
    created: bool


def adjustment_request_open(
    *, bill_number: object, external_reference: object, note: object = "", opened_by_agent: Agent | None = None
) -> AdjustmentRequestResult:
    """Open the next adjustment request on a bill, or return the one this reference opened.

    Idempotent by external reference (the matcher's exception id); numbered per bill under the
    bill's row lock, so two requests on one bill are numbered one after the other. A request
    opened by an agent records it, and another agent cannot read it back by its reference
    (AdjustmentRequestTaken) nor propose against it.
    """
    problems: list[FieldProblem] = []
    bill_ref = check_reference("bill_number", bill_number, problems)
    reference = check_external_reference(external_reference, problems)
    note_text = check_note(note, problems)
    if problems:
        raise ProposalInvalid(problems)
    assert bill_ref is not None and reference is not None

    with transaction.atomic(durable=True):
        bill = Bill.objects.select_for_update().filter(number=bill_ref).first()
        if bill is None:
            raise ProposalInvalid.for_field("bill_number", "not_found", f"There is no bill {bill_ref}.")
        existing = AdjustmentRequest.objects.select_related("bill").filter(external_reference=reference).first()
        if existing is not None:
            return _request_or_conflict(existing, bill.number, opened_by_agent=opened_by_agent)
        number = (AdjustmentRequest.objects.filter(bill=bill).aggregate(top=Max("number"))["top"] or 0) + 1
        try:
            with transaction.atomic():
                request = AdjustmentRequest.objects.create(
                    bill=bill,
                    number=number,
                    external_reference=reference,
                    note=note_text,
                    opened_by_agent=opened_by_agent,
                )
        except IntegrityError:
            winner = AdjustmentRequest.objects.select_related("bill").filter(external_reference=reference).first()
            if winner is None:
                raise
            return _request_or_conflict(winner, bill.number, opened_by_agent=opened_by_agent)
        return AdjustmentRequestResult(request=request, created=True)


def _request_or_conflict(
    request: AdjustmentRequest, bill_number: str, *, opened_by_agent: Agent | None = None
) -> AdjustmentRequestResult:
    if opened_by_agent is not None and request.opened_by_agent_id not in (None, opened_by_agent.pk):
        raise AdjustmentRequestTaken(request.external_reference)
    if request.bill.number == bill_number:
        return AdjustmentRequestResult(request=request, created=False)
    raise AdjustmentRequestConflict(
        request, {"bill_number": {"existing": request.bill.number, "proposed": bill_number}}
    )
