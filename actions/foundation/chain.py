"""The audit trail's hashes: one event's content hash, its chain link, a checkpoint's Merkle root
and its signature (docs/evidence.md).

Pure functions on plain values, standard library only: the console computes with them, and the
standalone verifier (tools/verify_evidence.py) repeats the same few lines without the console,
so that an auditor need not trust this code to check what it wrote
(tests/evidence/test_bundle.py holds the two to the same answers).

- An event's **content hash** is SHA-256 over the canonical JSON (sorted keys, no spaces, ASCII)
  of its fields: the action's id (the business id, e.g. ``refund:order-4821:request-3``), its
  sequence in the action's trail, the transition, the states, who acted, the reason, the
  evidence and the time (UTC, microseconds).
- Its **chain hash** is SHA-256 over the previous event's chain hash (of the same action; 64
  zeros for the first) followed by its content hash, both as hex text. Editing, removing,
  inserting or reordering an event breaks every chain hash after it.
- A **checkpoint** is a Merkle tree (RFC 6962's leaf and node prefixes, so that a leaf cannot
  pass for a node) over its period's events in key order, each leaf naming the event's key,
  action, sequence and chain hash. Its hash covers the root and the previous checkpoint's hash;
  its signature is HMAC-SHA256 over that hash with a key held outside the database.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime
from typing import Any

GENESIS = "0" * 64
ALGORITHM = "hmac-sha256"


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def timestamp(moment: datetime) -> str:
    """An aware time as the hashes read it: UTC, to the microsecond."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def event_content(
    *,
    action: str,
    sequence: int,
    transition: str,
    from_state: str,
    to_state: str,
    actor_kind: str,
    actor_label: str,
    actor_user: int | None,
    actor_agent: int | None,
    reason: str,
    evidence: Any,
    created_at: datetime | str,
) -> dict[str, Any]:
    """The fields an event's content hash covers, as plain JSON values."""
    return {
        "action": action,
        "sequence": sequence,
        "transition": transition,
        "from_state": from_state,
        "to_state": to_state,
        "actor_kind": actor_kind,
        "actor_label": actor_label,
        "actor_user": actor_user,
        "actor_agent": actor_agent,
        "reason": reason,
        # As stored: a JSON column gives back JSON values, and only those are hashed.
        "evidence": json.loads(json.dumps(evidence)),
        "created_at": created_at if isinstance(created_at, str) else timestamp(created_at),
    }


# The columns of a stored event, as ``.values()`` names them, from which its content is read back:
# the verifier and the migration that chained the older trail read these, so neither can hash a
# field the writer does not, or miss one it does.
EVENT_ROW_FIELDS = (
    "action__action_id",
    "sequence",
    "transition",
    "from_state",
    "to_state",
    "actor_kind",
    "actor_label",
    "actor_user_id",
    "actor_agent_id",
    "reason",
    "evidence",
    "created_at",
)


def row_event_content(row: dict[str, Any], *, sequence: int | None = None) -> dict[str, Any]:
    """The content of an event read back as a row of ``EVENT_ROW_FIELDS``; ``sequence`` stands in
    for the row's own (the migration numbering an unchained trail, or the verifier testing a swap)."""
    return event_content(
        action=row["action__action_id"],
        sequence=row["sequence"] if sequence is None else sequence,
        transition=row["transition"],
        from_state=row["from_state"],
        to_state=row["to_state"],
        actor_kind=row["actor_kind"],
        actor_label=row["actor_label"],
        actor_user=row["actor_user_id"],
        actor_agent=row["actor_agent_id"],
        reason=row["reason"],
        evidence=row["evidence"],
        created_at=row["created_at"],
    )


def content_hash(content: dict[str, Any]) -> str:
    return sha256_hex(canonical_json(content))


def chain_link(previous: str, content: str) -> str:
    """The chain hash of an event whose content hash is ``content``, after ``previous``."""
    return sha256_hex((previous + content).encode("ascii"))


# --- checkpoints ---------------------------------------------------------------------------------


def merkle_leaf(*, event_id: int, action: str, sequence: int, chain_hash: str) -> str:
    return sha256_hex(b"\x00" + canonical_json([event_id, action, sequence, chain_hash]))


def _node(left: str, right: str) -> str:
    return sha256_hex(b"\x01" + bytes.fromhex(left) + bytes.fromhex(right))


def merkle_root(leaves: list[str]) -> str:
    """The root over these leaf hashes; a level's odd last node is carried up as it is. No
    leaves: the hash of nothing."""
    if not leaves:
        return sha256_hex(b"")
    level = leaves
    while len(level) > 1:
        level = [_node(level[i], level[i + 1]) if i + 1 < len(level) else level[i] for i in range(0, len(level), 2)]
    return level[0]


def merkle_proof(leaves: list[str], index: int) -> list[tuple[str, str]]:
    """The path from leaf ``index`` to the root: (side, sibling hash) pairs, side "L" when the
    sibling is on the left."""
    proof: list[tuple[str, str]] = []
    level = leaves
    while len(level) > 1:
        sibling = index ^ 1
        if sibling < len(level):
            proof.append(("L" if sibling < index else "R", level[sibling]))
        level = [_node(level[i], level[i + 1]) if i + 1 < len(level) else level[i] for i in range(0, len(level), 2)]
        index //= 2
    return proof


def merkle_climb(leaf: str, proof: list[tuple[str, str]] | list[list[str]]) -> str:
    node = leaf
    for side, sibling in proof:
        node = _node(sibling, node) if side == "L" else _node(node, sibling)
    return node


def checkpoint_content(
    *,
    number: int,
    created_at: datetime | str,
    txid_below: int | None,
    id_upto: int | None,
    event_count: int,
    first_event: int | None,
    last_event: int | None,
    root: str,
    previous_hash: str,
) -> dict[str, Any]:
    return {
        "number": number,
        "created_at": created_at if isinstance(created_at, str) else timestamp(created_at),
        "txid_below": txid_below,
        "id_upto": id_upto,
        "event_count": event_count,
        "first_event": first_event,
        "last_event": last_event,
        "root": root,
        "previous_hash": previous_hash,
    }


def key_id(key: bytes) -> str:
    """A name for a signing key that does not reveal it: the first 16 hex digits of its SHA-256."""
    return sha256_hex(b"trail-signing-key:" + key)[:16]


def sign(key: bytes, checkpoint_hash: str) -> str:
    return sign_bytes(key, checkpoint_hash.encode("ascii"))


def sign_bytes(key: bytes, data: bytes) -> str:
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def signature_valid(key: bytes, checkpoint_hash: str, signature: str) -> bool:
    return hmac.compare_digest(sign(key, checkpoint_hash), signature)
