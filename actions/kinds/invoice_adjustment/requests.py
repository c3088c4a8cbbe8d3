"""Adjustment requests: the accounts-payable matcher's exception on a bill, opened before a proposal.

A request is numbered per bill (adjustment-1, adjustment-2...) and that number becomes part of
the action id of the adjustment proposed for it. Opening one is idempotent by its external
reference (the matcher's exception id): a retry returns the request that exists.
"""

from __future__ import annotations

from actions.kinds.fields import FieldProblem, ProposalInvalid, check_external_reference, check_note, check_reference
from actions.kinds.invoice_adjustment.checks import ADJUSTMENT_REQUEST_FIELDS
from actions.models import AdjustmentRequest, Agent, Bill
from actions.services import RequestBook, RequestConflict, RequestOpened, RequestTaken


class AdjustmentRequestConflict(RequestConflict):
    request_words = "an adjustment request"
    target_words = "bill"
    one_request_is = "One mismatch"


class AdjustmentRequestTaken(RequestTaken):
    pass


ADJUSTMENT_REQUESTS = RequestBook(
    AdjustmentRequest,
    Bill,
    taken=AdjustmentRequestTaken,
    conflict=AdjustmentRequestConflict,
    names=ADJUSTMENT_REQUEST_FIELDS,
)


def adjustment_request_open(
    *, bill_number: object, external_reference: object, note: object = "", opened_by_agent: Agent | None = None
) -> RequestOpened[AdjustmentRequest]:
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

    return ADJUSTMENT_REQUESTS.open(bill_ref, reference, opened_by_agent=opened_by_agent, note=note_text)
