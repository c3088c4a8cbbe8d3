"""What every effect kind declares, and the generic words the engine speaks.

The engine (claim, send, record, reconcile, escalate, sweep, resolve, audit) knows only what is
in this module: a kind's receiver contract as data, a receiver that can send and perhaps look
up, the generic ``Effect`` a receiver reports, and the ``Outcome`` an answer proves. Everything
that differs between a refund, an invoice adjustment and an email lives in the kind's own module
(docs/architecture.md section 10), registered in ``actions.kinds.registry``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from django.conf import settings

from actions.providers.money import money_text

if TYPE_CHECKING:
    from actions.models import Action


class DuplicateCorrection(enum.StrEnum):
    """How a kind's duplicate effect is corrected, once the ledger audit found one (the fifth of
    the five checks): the admin's correction pages and services follow this, never the name."""

    # A compensating action is proposed; recovering the money is then a manual step for finance.
    RECOVER = "recover"
    # The duplicate artifact (a credit note) is voided at the receiver by an action of its own.
    VOID = "void"
    # No correction the console can start: a person explains it.
    EXPLAIN = "explain"


class StepClass(enum.StrEnum):
    """How dangerous repeating a step is (docs/architecture.md section 10); it sets the recovery policy."""

    READ = "read"
    SET = "set"
    CREATE = "create"
    IRREVERSIBLE = "irreversible"


@dataclass(frozen=True)
class ReceiverContract:
    """What a kind's receiver guarantees, as data. The engine decides from this, never from a name."""

    # Shown to people: "payment provider", "accounting system", "mail relay".
    receiver: str
    # The receiver executes a request at most once per key and replays the stored answer.
    honours_keys: bool
    # How long the receiver remembers a key. Past it, a resend with the same key can execute
    # again, so only an authoritative not-found allows a retry. None: no keys, or kept forever.
    key_retention: timedelta | None
    # The receiver can be asked whether an effect exists (by its reference or by our action id).
    supports_lookup: bool
    # A lookup that finds nothing proves nothing exists (once the visibility delay has passed).
    lookup_authoritative: bool
    # How long after creation an effect may still be missing from lookups.
    lookup_visibility_delay: timedelta
    # An accepted effect can still settle later (pending -> succeeded or failed).
    can_settle_later: bool
    step_class: StepClass
    # How a person corrects a wrong or duplicate effect of this kind, in a clerk's words.
    correction_path: str

    @property
    def can_be_asked(self) -> bool:
        """Reconciliation can learn something: by a lookup, or by resending under a kept key."""
        return self.supports_lookup or self.honours_keys


class Outcome(enum.Enum):
    """What a receiver's answer proves about the effect."""

    SUCCEEDED = "succeeded"
    PENDING = "pending"
    FAILED_FINAL = "failed_final"
    UNKNOWN = "unknown"
    NEEDS_REVIEW = "needs_review"
    # The answer proves the receiver was never handed the request (an SMTP 4xx before DATA, a
    # refused connection): nothing happened, so sending it later is not a repeat.
    NOT_SENT = "not_sent"


@dataclass(frozen=True)
class Effect:
    """One effect as its receiver reports it: a refund, a credit note, a message.

    ``status`` is the receiver's own word for it; ``outcome`` is what the kind's answer table
    concludes from that word. ``raw`` is the receiver's record, kept as evidence.
    """

    reference: str
    status: str
    outcome: Outcome
    amount_minor: int | None
    currency: str
    action_id: str | None
    raw: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)
    # When the receiver created it, by the receiver's clock; None where the receiver does not say.
    created: datetime | None = field(default=None, compare=False)

    @property
    def is_effect(self) -> bool:
        """Whether this record is an effect that happened (or will): failed records are not."""
        return self.outcome in (Outcome.SUCCEEDED, Outcome.PENDING)

    def answer(self) -> Answer:
        """The receiver's record of the effect, read as an answer (what reconciliation found)."""
        return Answer(outcome=self.outcome, effect=self)


class ReceiverError(Exception):
    """An error a kind's receiver raised, as the engine records it. ``raw`` is the receiver's JSON."""

    code: str | None = None
    http_status: int | None = None
    message: str = ""
    raw: dict[str, Any] | None = None


@dataclass(frozen=True)
class Answer:
    """A receiver's answer to one send, with what the console concludes from it."""

    outcome: Outcome
    effect: Effect | None = None
    error: Exception | None = None

    @property
    def reference(self) -> str:
        return self.effect.reference if self.effect is not None else ""

    def response_json(self) -> dict[str, Any] | None:
        return dict(self.effect.raw) if self.effect is not None else None

    def error_json(self) -> dict[str, Any] | None:
        return error_json(self.error) if self.error is not None else None

    def summary(self) -> str:
        if self.effect is not None:
            return f"{self.effect.reference} {self.effect.status}"
        assert self.error is not None
        return f"{type(self.error).__name__}: {self.error}"


def error_json(error: Exception) -> dict[str, Any]:
    return {
        "type": type(error).__name__,
        "code": getattr(error, "code", None),
        "http_status": getattr(error, "http_status", None),
        "message": getattr(error, "message", str(error)),
        "raw": getattr(error, "raw", None),
    }


class LookupVerdict:
    FOUND = "found"
    DUPLICATE = "duplicate"
    NOT_FOUND = "not_found"
    INCONCLUSIVE = "inconclusive"


@dataclass
class Lookup:
    """What a receiver said when asked about one action."""

    verdict: str
    effects: list[Effect] = field(default_factory=list)
    error: Exception | None = None
    # The lookup proved that the effect's target itself is missing (e.g. no such charge):
    # inconclusive for reconciliation, but proof that no effect can exist on it.
    target_missing: bool = False

    def response_json(self) -> dict[str, Any]:
        return {"effects": [dict(e.raw) for e in self.effects]}

    def error_json(self) -> dict[str, Any] | None:
        if self.error is None:
            return None
        return {
            "type": type(self.error).__name__,
            "code": getattr(self.error, "code", None),
            "message": getattr(self.error, "message", str(self.error)),
        }

    @property
    def live_effects(self) -> list[Effect]:
        return [effect for effect in self.effects if effect.is_effect]


def lookup_from_effects(effects: list[Effect]) -> Lookup:
    if not effects:
        return Lookup(LookupVerdict.NOT_FOUND)
    if len(effects) > 1:
        return Lookup(LookupVerdict.DUPLICATE, effects)
    return Lookup(LookupVerdict.FOUND, effects)


@dataclass(frozen=True)
class LedgerWindow:
    """A span of the receiver's ledger by creation time: from ``start`` (None: from its first
    record) up to, not including, ``end``. The audit reads one window at a time."""

    start: datetime | None
    end: datetime

    def holds(self, created: datetime) -> bool:
        return (self.start is None or self.start <= created) and created < self.end

    def epoch_seconds(self) -> tuple[int | None, int]:
        """The bounds in whole seconds since the epoch, as Stripe's ``created`` filter takes them.
        The audit cuts its windows on whole seconds, so nothing is lost in the rounding."""
        start = None if self.start is None else math.floor(self.start.timestamp())
        return start, math.ceil(self.end.timestamp())


class LedgerUnavailable(Exception):
    """The receiver's ledger could not be read (network, 5xx): the audit records the error."""


class Receiver(Protocol):
    """A kind's receiver, as the engine uses it. Adapters in ``actions.providers`` sit behind it."""

    contract: ReceiverContract

    def send(self, action: Action) -> Answer:
        """Send the action's request once, with its key. Never raises: errors are answers."""
        ...

    def lookup(self, action: Action) -> Lookup:
        """Ask the receiver what it has for the action. Only called when the contract allows it."""
        ...

    def ledger(self, window: LedgerWindow | None = None) -> Iterator[Effect]:
        """The effects the receiver created in ``window`` (None: every effect), for audits,
        read page by page. Raises LedgerUnavailable."""
        ...


@dataclass(frozen=True)
class Explanations:
    """Plain words about a kind, for pages, audit events and messages."""

    noun: str  # "refund", "credit note", "message"
    succeeded: str  # event reason when the receiver confirmed it
    pending: str
    failed: str
    on_failure: str  # what happens for the person affected when it fails for good


@dataclass(frozen=True)
class BindingFailure:
    binding: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"binding": self.binding, "message": self.message}


class EffectKind:
    """Everything kind-specific about an effect. Subclass, fill in, and register.

    The default hooks describe a kind with no money to reserve and no target to bind to: an
    email, say. A refund overrides them to draw on its order's refundable balance.
    """

    name: ClassVar[str]
    label: ClassVar[str]
    # The group whose members are handed this kind's escalations.
    owner_group: ClassVar[str] = "finance"
    explanations: ClassVar[Explanations]
    # Identity (the first of the five checks): the id's pattern and an example.
    id_pattern: ClassVar[str]
    example_action_id: ClassVar[str]
    # What the approval binds besides amount, currency, payload hash and expiry.
    binds: ClassVar[str] = "amount, currency, payload hash and expiry"
    # Whether the ledger audit can list this kind's effects at its receiver.
    has_ledger: ClassVar[bool] = True
    # What a person chooses from when recording a final failure by hand: (value, label). Empty
    # where the failure needs no follow-up.
    failure_choices: ClassVar[tuple[tuple[str, str], ...]] = ()
    # Whether the kind moves money. One that does not (an email) carries no amount and no
    # currency: no approval limit applies, and the auto-approval policy never decides it.
    moves_money: ClassVar[bool] = True
    # What finance's resolutions are called for this kind, in a clerk's words.
    resolution_labels: ClassVar[dict[str, str]] = {
        "succeeded": "Record as succeeded",
        "retry": "Retry with the same key",
        "failed": "Record as failed",
        "resend": "Send again",
    }
    # The answer table in a clerk's words, for the /kinds/ page: (the receiver's answer, what the
    # console does, whether that leaves the outcome proven). Empty: the page shows none.
    answer_table: ClassVar[tuple[tuple[str, str, bool], ...]] = ()
    # Which of finance's resolutions the review page offers for this kind.
    resolutions: ClassVar[tuple[str, ...]] = ("succeeded", "retry", "failed")
    # Recording a success by hand needs written evidence (the receiver cannot be asked, so the
    # person's evidence is the only record of the effect).
    confirmation_needs_evidence: ClassVar[bool] = False
    # How a duplicate of this kind's effect is corrected.
    duplicate_correction: ClassVar[DuplicateCorrection] = DuplicateCorrection.EXPLAIN
    # For a kind that corrects another (a compensation, a void): what happens once a manager
    # approves it, in an admin's words.
    correction_followup: ClassVar[str] = ""
    # The version of the payload this kind composes, stamped on every payload and so part of its
    # hash. Raise it whenever the composition changes (a field added, dropped or renamed): a
    # retry composed the new way then replays the action composed the old way when every field
    # both share agrees, instead of meeting a 409 (actions.services, payload_same_proposal).
    payload_schema_version: ClassVar[int] = 1

    # --- the receiver -----------------------------------------------------------------

    def ledger_enabled(self) -> bool:
        """Whether the audits read this kind's ledger now: it has one, and its receiver is
        configured in this deployment (a shop without an accounting system has no ledger to read)."""
        return self.has_ledger

    def receiver(self) -> Receiver:
        raise NotImplementedError

    def contract(self) -> ReceiverContract:
        return self.receiver().contract

    def request_body(self, action: Action) -> dict[str, Any]:
        """What is sent to the receiver, recorded on the attempt before sending."""
        return {"idempotency_key": action.idempotency_key, "action_id": action.action_id}

    def lookup_request(self, action: Action) -> dict[str, Any]:
        """What a lookup asks, recorded on the lookup attempt."""
        return {"action_id": action.action_id, "reference": action.provider_reference, "for_status": action.status}

    def expected_amount_minor(self, action: Action) -> int | None:
        """The amount an effect of this action must carry, in the receiver's minor units."""
        return None

    # --- the approval's binding and the reservation -------------------------------------

    def target_version(self, action: Action) -> int | None:
        """The version of the action's target an approval binds to; None where there is none."""
        return None

    def target_changed_words(self, action: Action, *, shown_version: int | None) -> str:
        """What changed on the action's target since a page showed it at ``shown_version``, in a
        clerk's words: a manager's decision made on an older page is refused with this sentence.
        A kind says what happened where it can tell (another refund went ahead); this is the
        sentence where it cannot."""
        return f"What this proposal is about ({self.target_label(action)}) changed since you opened this page."

    def approval_refusal(self, action: Action) -> tuple[str, str] | None:
        """Why no approval could hold now (the target cannot cover it), as (code, message)."""
        return None

    def target_balance(self, action: Action) -> tuple[str, Decimal] | None:
        """What the target has left for actions of this kind, as (what it is called, amount);
        None for a kind that draws on no balance. A grouped decision checks its sum against it."""
        return None

    def auto_approval_threshold(self, currency: str) -> Decimal | None:
        """The most the auto-approval policy may approve for one action of this kind in
        ``currency``; None leaves every action of the kind to a manager."""
        return settings.AUTO_APPROVAL_THRESHOLDS.get(currency)

    def auto_approval_refusal(self, action: Action) -> str | None:
        """Why the auto-approval policy must leave this action to a manager, if it must."""
        return None

    def reserve(self, action: Action, *, approved_version: int | None) -> list[BindingFailure]:
        """Reserve what the action draws on, in the claim's transaction; failures roll it back."""
        return []

    def book_success(self, action: Action) -> None:
        """The action SUCCEEDED: turn the reservation into its final booking (same transaction)."""

    def release(self, action: Action) -> None:
        """The action FAILED_FINAL: release the reservation (same transaction)."""

    def on_success(self, action: Action) -> None:
        """Follow-ups after a success, in the recording transaction."""

    def on_failure(self, action: Action) -> None:
        """Follow-ups after a final failure, in the recording transaction."""

    def failure_resolved(self, action: Action, *, owner: Any, choice: str, amount: Decimal, note: str) -> Any:
        """Finance recorded a final failure by hand: open the chosen follow-up (same transaction)."""
        return None

    def explained_effects(self) -> dict[str, str]:
        """Effects at this kind's receiver that no action made but that the console has booked
        by other means (e.g. an outside refund learnt from a webhook), as reference -> how.
        The audits count them as explained, not as effects without an action."""
        return {}

    def money_violations(self) -> tuple[int, list[tuple[str, str]]]:
        """Invariant 5 for this kind's targets: how many were checked, and (subject, message) for
        each one whose money does not add up."""
        return 0, []

    def target_label(self, action: Action) -> str:
        return str(action.payload.get("target", "")) or "-"

    def bind_target(self, action: Action, payload: dict[str, Any]) -> None:
        """Set an unsaved action's target from a workflow step's payload (an order and its refund
        request, a bill): the coordinator builds its children through this. Nothing by default."""

    def message_preview(self, action: Action) -> dict[str, str] | None:
        """For a kind that sends a message: exactly what will be sent, for the manager's page."""
        return None

    def default_reference(self, action: Action) -> str:
        """The effect's reference when its receiver issues none of its own (an email's
        Message-ID), offered when a person confirms it by hand; empty where the receiver names it."""
        return ""

    def __repr__(self) -> str:
        return f"<EffectKind {self.name}>"


def amount_text(amount: Decimal, currency: str) -> str:
    return money_text(amount, currency)
