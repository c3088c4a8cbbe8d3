#!/usr/bin/env python3
"""Check an effect console evidence bundle without the console: Python's standard library only.

    python tools/verify_evidence.py BUNDLE.json [BUNDLE.json ...] [--key KEY] [--require-checkpoint]

The key is the trail's signing key (TRAIL_SIGNING_KEY), given to auditors apart from the bundles;
``--key`` or the TRAIL_SIGNING_KEY environment variable. It checks:

1. the payload hash: SHA-256 over the payload's canonical JSON, and every approval bound to it;
2. the action's trail: sequences 1, 2, ... with no gap, each event's content hash recomputed
   from its fields, each chain hash from the previous one (64 zeros before the first);
0. with the key, the console's signature over the whole bundle (no byte changed since export);
3. each event a checkpoint covers: the Merkle path from the event's leaf to the checkpoint's
   root, the checkpoint's hash over its fields, and its HMAC-SHA256 signature under the key.

Checkpoints are signed with HMAC (a shared key) rather than Ed25519 so that this file needs
nothing outside the standard library; the price is that whoever can verify could also sign.
It repeats the few functions of actions/foundation/chain.py on purpose: an auditor can read
these 200 lines instead of trusting the console that wrote the bundle.

Exit status 0: everything checked holds; 1: something does not (the first failure is named);
2: the bundle cannot be read.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import sys
from pathlib import Path
from typing import Any

GENESIS = "0" * 64


class Failed(Exception):
    pass


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def chain_link(previous: str, content: str) -> str:
    return sha256_hex((previous + content).encode("ascii"))


def merkle_leaf(event_id: int, action: str, sequence: int, chain_hash: str) -> str:
    return sha256_hex(b"\x00" + canonical_json([event_id, action, sequence, chain_hash]))


def merkle_node(left: str, right: str) -> str:
    return sha256_hex(b"\x01" + bytes.fromhex(left) + bytes.fromhex(right))


def merkle_climb(leaf: str, path: list[list[str]]) -> str:
    node = leaf
    for side, sibling in path:
        node = merkle_node(sibling, node) if side == "L" else merkle_node(node, sibling)
    return node


CHECKPOINT_FIELDS = (
    "number",
    "created_at",
    "txid_below",
    "id_upto",
    "event_count",
    "first_event",
    "last_event",
    "root",
    "previous_hash",
)


def check_bundle_signature(bundle: dict[str, Any], key: bytes | None) -> None:
    """The console's signature over the whole bundle: no byte of it changed since the export."""
    signature = bundle.get("bundle_signature")
    if key is None:
        return
    if not isinstance(signature, dict):
        raise Failed("the bundle carries no signature")
    unsigned = {name: value for name, value in bundle.items() if name != "bundle_signature"}
    expected = hmac.new(key, canonical_json(unsigned), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, str(signature.get("hmac_sha256", ""))):
        raise Failed("the bundle's signature does not verify: it changed after the export, or the key differs")


def check_payload(action: dict[str, Any], approvals: list[dict[str, Any]]) -> None:
    text = json.dumps(action["payload"], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = "sha256:" + sha256_hex(text.encode())
    if digest != action["payload_hash"]:
        raise Failed(f"the payload does not hash to the recorded payload hash {action['payload_hash']}")
    for approval in approvals:
        if approval.get("decision") == "approve" and approval.get("payload_hash") != digest:
            raise Failed(f"approval {approval.get('id')} is bound to another payload hash")


def check_events(action_id: str, events: list[dict[str, Any]]) -> None:
    previous = GENESIS
    for expected, event in enumerate(events, start=1):
        content = event["content"]
        where = f"event {event['id']} (sequence {content.get('sequence')})"
        if content.get("action") != action_id:
            raise Failed(f"{where} belongs to {content.get('action')}, not {action_id}")
        if content.get("sequence") != expected:
            raise Failed(f"{where}: sequence {expected} expected (an event removed, inserted or moved)")
        if sha256_hex(canonical_json(content)) != event["content_hash"]:
            raise Failed(f"{where}: its fields do not match its content hash (edited)")
        if chain_link(previous, event["content_hash"]) != event["chain_hash"]:
            raise Failed(f"{where}: its chain hash does not follow from the event before it")
        previous = event["chain_hash"]


def check_checkpoints(bundle: dict[str, Any], key: bytes | None) -> tuple[int, int]:
    """(events proven under a checkpoint, events not yet covered by one)."""
    action_id = bundle["action"]["action_id"]
    checkpoints = {c["number"]: c for c in bundle.get("checkpoints", [])}
    for number, checkpoint in checkpoints.items():
        fields = {name: checkpoint[name] for name in CHECKPOINT_FIELDS}
        if sha256_hex(canonical_json(fields)) != checkpoint["checkpoint_hash"]:
            raise Failed(f"checkpoint {number}: its fields do not match its hash")
        if checkpoint.get("algorithm") != "hmac-sha256":
            raise Failed(f"checkpoint {number}: unknown signature algorithm {checkpoint.get('algorithm')}")
        if key is not None:
            expected = hmac.new(key, checkpoint["checkpoint_hash"].encode("ascii"), hashlib.sha256).hexdigest()
            if not hmac.compare_digest(expected, checkpoint["signature"]):
                raise Failed(f"checkpoint {number}: its signature does not verify under the key given")
        follows = checkpoints.get(number - 1)
        if follows is not None and checkpoint["previous_hash"] != follows["checkpoint_hash"]:
            raise Failed(f"checkpoint {number} does not follow checkpoint {number - 1}")
    proven = uncovered = 0
    for event in bundle["events"]:
        merkle = event.get("merkle")
        if merkle is None:
            uncovered += 1
            continue
        checkpoint = checkpoints.get(merkle["checkpoint"])
        if checkpoint is None:
            raise Failed(f"event {event['id']}: its checkpoint {merkle['checkpoint']} is not in the bundle")
        leaf = merkle_leaf(event["id"], action_id, event["content"]["sequence"], event["chain_hash"])
        if merkle_climb(leaf, merkle["path"]) != checkpoint["root"]:
            raise Failed(
                f"event {event['id']}: its Merkle path does not reach checkpoint {checkpoint['number']}'s root"
            )
        proven += 1
    return proven, uncovered


def verify_bundle(bundle: dict[str, Any], *, key: bytes | None, require_checkpoint: bool = False) -> str:
    """A line saying what was checked; raises Failed at the first thing that does not hold."""
    action = bundle["action"]
    check_bundle_signature(bundle, key)
    check_payload(action, bundle.get("approvals", []))
    check_events(action["action_id"], bundle["events"])
    proven, uncovered = check_checkpoints(bundle, key)
    if require_checkpoint and uncovered:
        raise Failed(f"{uncovered} event(s) are not yet covered by a checkpoint")
    signed = "signatures checked" if key is not None else "signatures NOT checked (no key given)"
    return (
        f"{action['action_id']}: payload hash, {len(bundle['events'])} events chained, {proven} proven under "
        f"{len(bundle.get('checkpoints', []))} checkpoint(s), {uncovered} not yet covered; {signed}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundles", nargs="+", type=Path)
    parser.add_argument("--key", default=os.environ.get("TRAIL_SIGNING_KEY"), help="the trail's signing key")
    parser.add_argument("--require-checkpoint", action="store_true", help="fail when an event has no checkpoint yet")
    args = parser.parse_args(argv)
    key = args.key.encode("utf-8") if args.key else None
    status = 0
    for path in args.bundles:
        try:
            bundle = json.loads(path.read_bytes())
            print(f"OK {path}: {verify_bundle(bundle, key=key, require_checkpoint=args.require_checkpoint)}")
        except Failed as failed:
            print(f"FAILED {path}: {failed}")
            status = max(status, 1)
        except (OSError, ValueError, KeyError, TypeError) as unreadable:
            print(f"UNREADABLE {path}: {unreadable!r}")
            status = 2
    if key is None and status == 0:
        print("no key given: the checkpoints' signatures were not checked", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
