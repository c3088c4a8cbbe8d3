"""An action's evidence bundle: everything an auditor needs to check what happened to it, in one
JSON document that tools/verify_evidence.py checks without the console (docs/evidence.md).

It holds the proposal and its payload hash, the approvals (who, under which limit or policy,
the bound version, amount, payload hash and expiry), each attempt's request and answer (the
lookups are reconciliation's), the target's money and its history, the follow-ups, every event
with its content and hashes, and the checkpoints that cover the events, each with the Merkle
path from the event to the signed root.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.utils import timezone

from actions.evidence.checkpoints import checkpoint_document, checkpoint_events, checkpoint_leaves, signing_key
from actions.foundation.chain import ALGORITHM, canonical_json, key_id, merkle_proof, sign_bytes
from actions.foundation.trail import event_content_of, trail_events
from actions.models import Action, Attempt, AttemptKind, Checkpoint, Discrepancy, OrderEvent, Remedy
from actions.models.actions import AuditEvent
from approvals.models import Approval

FORMAT = "effect-console-evidence/1"


def _plain(value: Any) -> Any:
    """Model values as JSON values: times in ISO 8601, money as text."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def _row(obj: Any, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: _plain(getattr(obj, name)) for name in names}


def _approvals(action: Action) -> list[dict[str, Any]]:
    rows = Approval.objects.filter(action=action).select_related("approver").order_by("id")
    names = (
        "decision",
        "decided_by_label",
        "policy",
        "policy_detail",
        "note",
        "decided_at",
        "order_version",
        "amount",
        "currency",
        "payload_hash",
        "expires_at",
        "reason_code",
    )
    return [{"id": a.pk, "approver": a.approver.get_username() if a.approver else None, **_row(a, names)} for a in rows]


def _attempts(action: Action) -> list[dict[str, Any]]:
    names = (
        "kind",
        "lease_token",
        "idempotency_key",
        "request",
        "response",
        "error",
        "outcome",
        "held_lease",
        "started_at",
        "finished_at",
    )
    return [{"id": a.pk, **_row(a, names)} for a in Attempt.objects.filter(action=action).order_by("id")]


def _target(action: Action) -> dict[str, Any] | None:
    order = action.order
    if order is None:
        return None
    history = OrderEvent.objects.filter(order=order).order_by("created_at", "id")
    return {
        "order": order.number,
        "now": _row(
            order,
            ("currency", "captured_amount", "refunded_amount", "reserved_amount", "outside_refunded_amount", "version"),
        ),
        "history": [
            {
                "id": e.pk,
                **_row(
                    e, ("kind", "message", "amount", "currency", "reference", "version_after", "details", "created_at")
                ),
            }
            for e in history
        ],
    }


def _follow_ups(action: Action) -> dict[str, Any]:
    remedies = Remedy.objects.filter(action=action).order_by("id")
    discrepancies = Discrepancy.objects.filter(action=action).order_by("id")
    return {
        "remedies": [
            {"id": r.pk, **_row(r, ("kind", "status", "amount", "currency", "note", "created_at", "updated_at"))}
            for r in remedies
        ],
        "discrepancies": [
            {"id": d.pk, **_row(d, ("kind", "status", "provider_reference", "details", "note", "detected_at"))}
            for d in discrepancies
        ],
    }


def _covering(event: AuditEvent, checkpoints: list[Checkpoint]) -> Checkpoint | None:
    for checkpoint in checkpoints:
        if checkpoint.txid_below is not None and event.txid is not None:
            if event.txid < checkpoint.txid_below:
                return checkpoint
        elif checkpoint.id_upto is not None and event.pk <= checkpoint.id_upto:
            return checkpoint
    return None


def evidence_bundle(*, action_pk: int, now: datetime | None = None) -> dict[str, Any]:
    """The bundle of one action, as plain JSON values."""
    now = now or timezone.now()
    action = Action.objects.select_related("order", "proposed_by_agent", "proposed_by_user").get(pk=action_pk)
    events = trail_events(action_id=action.pk, order=("sequence", "id"))
    checkpoints = list(Checkpoint.objects.order_by("number"))
    covering: dict[int, Checkpoint] = {}
    for event in events:
        found = _covering(event, checkpoints)
        if found is not None:
            covering[event.pk] = found
    proofs: dict[int, dict[str, Any]] = {}
    for checkpoint in {c.number: c for c in covering.values()}.values():
        previous = next((c for c in checkpoints if c.number == checkpoint.number - 1), None)
        leaves = checkpoint_leaves(checkpoint_events(checkpoint, previous))
        index = {pk: position for position, (pk, _) in enumerate(leaves)}
        hashes = [leaf for _, leaf in leaves]
        for event_pk, chosen in covering.items():
            if chosen.number == checkpoint.number and event_pk in index:
                proofs[event_pk] = {
                    "checkpoint": checkpoint.number,
                    "path": [list(step) for step in merkle_proof(hashes, index[event_pk])],
                }
    return {
        "format": FORMAT,
        "generated_at": now.isoformat(),
        "action": {
            "action_id": action.action_id,
            "kind": action.kind,
            "idempotency_key": action.idempotency_key,
            "payload": action.payload,
            "payload_hash": action.payload_hash,
            "amount": _plain(action.amount),
            "currency": action.currency,
            "status": action.status,
            "proposed_by_agent": action.proposed_by_agent.name if action.proposed_by_agent else None,
            "proposed_by_user": action.proposed_by_user.get_username() if action.proposed_by_user else None,
            "owner": action.owner.get_username() if action.owner_id else None,
            "provider_reference": action.provider_reference,
            "created_at": _plain(action.created_at),
        },
        "approvals": _approvals(action),
        "attempts": [a for a in _attempts(action) if a["kind"] == AttemptKind.SUBMIT],
        "reconciliation_lookups": [a for a in _attempts(action) if a["kind"] == AttemptKind.LOOKUP],
        "target": _target(action),
        "follow_ups": _follow_ups(action),
        "events": [
            {
                "id": event.pk,
                "content": event_content_of(event, action_ref=action.action_id),
                "content_hash": event.content_hash,
                "chain_hash": event.chain_hash,
                "merkle": proofs.get(event.pk),
            }
            for event in events
        ],
        "checkpoints": [
            checkpoint_document(c)
            for c in sorted({c.number: c for c in covering.values()}.values(), key=lambda c: c.number)
        ],
        "signing": {
            "algorithm": ALGORITHM,
            "key_ids": sorted({c.key_id for c in covering.values()}),
            "note": "HMAC-SHA256: the verifier needs the trail's signing key, given to auditors apart from the bundle.",
        },
    }


def evidence_sign(bundle: dict[str, Any], *, key: bytes) -> dict[str, Any]:
    """The bundle with its own signature: HMAC-SHA256 over its canonical JSON. The chain and
    the checkpoints prove the events; this proves the rest (attempts, approvals, the target's
    money) is what the console exported, so that no byte of the file can change unnoticed."""
    unsigned = {name: value for name, value in bundle.items() if name != "bundle_signature"}
    return {
        **unsigned,
        "bundle_signature": {"key_id": key_id(key), "hmac_sha256": sign_bytes(key, canonical_json(unsigned))},
    }


def evidence_json(bundle: dict[str, Any]) -> bytes:
    """The bundle as written to a file: canonical JSON, so that the same bundle is the same bytes."""
    return canonical_json(bundle)


def evidence_actions(*, start: datetime, end: datetime) -> list[int]:
    """The keys of the actions proposed in [start, end)."""
    return list(
        Action.objects.filter(created_at__gte=start, created_at__lt=end).order_by("id").values_list("id", flat=True)
    )


def evidence_bundle_signed(*, action_pk: int, now: datetime | None = None) -> dict[str, Any]:
    return evidence_sign(evidence_bundle(action_pk=action_pk, now=now), key=signing_key())


def evidence_file_name(bundle: dict[str, Any]) -> str:
    """A file name from the action's id: its characters outside [A-Za-z0-9._-] become "_"."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", bundle["action"]["action_id"])


def evidence_page_context(bundle: dict[str, Any]) -> dict[str, Any]:
    """What the readable face shows: the bundle, and the JSON of its parts for people to read."""
    return {
        "bundle": bundle,
        "action": bundle["action"],
        "pretty": {
            name: json.dumps(bundle[name], indent=2, sort_keys=True)
            for name in ("approvals", "attempts", "reconciliation_lookups", "target", "follow_ups", "checkpoints")
        },
        "events": [
            {**event, "evidence_json": json.dumps(event["content"]["evidence"], indent=2, sort_keys=True)}
            for event in bundle["events"]
        ],
    }
