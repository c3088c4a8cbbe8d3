"""What the claim reports when an approval no longer binds its action (``binding_failures``).

The claim refuses to send when the approval is missing, expired, or bound to another amount,
currency or payload (docs/architecture.md section 5); the failures it returns are written to the STALE
action's audit event and shown to the manager who must decide again. The scenario tests check
that the action goes stale, not what the failures say, so mutmut's mutants of the names and
sentences survived them (tests/MUTATION.md). A pure function: no database needed.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from actions.engine.claim import binding_failures
from actions.models import Action
from approvals.models import Approval

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def _pair(**approval_changes: object) -> tuple[Action, Approval]:
    action = Action(amount=Decimal("45.00"), currency="EUR", payload_hash="sha256:abc")
    approval = Approval(
        amount=Decimal("45.00"), currency="EUR", payload_hash="sha256:abc", expires_at=NOW + timedelta(hours=1)
    )
    for name, value in approval_changes.items():
        setattr(approval, name, value)
    return action, approval


def _as_dicts(action: Action, approval: Approval | None) -> list[dict[str, str]]:
    return [failure.as_dict() for failure in binding_failures(action, approval, NOW)]


def test_an_approval_that_still_binds_reports_nothing() -> None:
    action, approval = _pair()
    assert _as_dicts(action, approval) == []


def test_no_approval_is_named_as_such() -> None:
    action, _ = _pair()
    assert _as_dicts(action, None) == [{"binding": "approval", "message": "There is no approval for this action."}]


def test_an_expired_approval_names_its_expiry_time() -> None:
    action, approval = _pair(expires_at=NOW - timedelta(seconds=1))
    assert _as_dicts(action, approval) == [
        {"binding": "expiry", "message": "The approval expired at 2026-12-01 11:59:59."}
    ]


def test_an_approval_expiring_this_very_moment_no_longer_binds() -> None:
    action, approval = _pair(expires_at=NOW)
    assert [failure["binding"] for failure in _as_dicts(action, approval)] == ["expiry"]


def test_an_approval_without_an_expiry_never_binds() -> None:
    action, approval = _pair(expires_at=None)
    assert _as_dicts(action, approval) == [
        {"binding": "expiry", "message": "The approval expired at (no expiry recorded)."}
    ]


def test_each_differing_binding_is_named_with_both_values_in_order() -> None:
    action, approval = _pair(amount=Decimal("40.00"), currency="USD", payload_hash="sha256:old")
    assert _as_dicts(action, approval) == [
        {"binding": "amount", "message": "Approved amount 40.00 differs from 45.00."},
        {"binding": "currency", "message": "Approved currency USD differs from EUR."},
        {"binding": "payload_hash", "message": "Approved payload_hash sha256:old differs from sha256:abc."},
    ]


def test_expiry_and_a_changed_amount_are_both_reported() -> None:
    action, approval = _pair(expires_at=NOW - timedelta(minutes=5), amount=Decimal("50.00"))
    assert [failure["binding"] for failure in _as_dicts(action, approval)] == ["expiry", "amount"]
