"""The intent log: orders and requests, actions and their audit trail, agents, follow-ups.

Split by subject so that each file stays readable; everything is importable from
``actions.models``.
"""

from __future__ import annotations

from actions.models.actions import (
    Action,
    ActionEvent,
    ActionKind,
    ActionStatus,
    ActorKind,
    ArchivedActionEvent,
    ReasonCode,
)
from actions.models.agent_webhooks import (
    AgentWebhook,
    AgentWebhookAttempt,
    AgentWebhookDelivery,
    DeliveryStatus,
    NotificationKind,
    NotificationSent,
)
from actions.models.agents import Agent, AgentToken
from actions.models.attempts import Attempt, AttemptKind
from actions.models.bills import AdjustmentReason, AdjustmentRequest, Bill
from actions.models.evidence import Checkpoint, RetentionTombstone
from actions.models.followups import (
    Discrepancy,
    DiscrepancyKind,
    DiscrepancyStatus,
    FollowUpStatus,
    LedgerAuditCursor,
    LedgerAuditRun,
    OwnerGroup,
    Remedy,
    RemedyKind,
)
from actions.models.orders import Order, OrderEvent, OrderEventKind, OutsideRefund, RefundRequest, RequestSource
from actions.models.people import Notification, UserSettings
from actions.models.schedule import SchedulePeriod
from actions.models.security import RateCounter, SecurityEvent, SecurityEventKind
from actions.models.suppliers import Supplier, SupplierContact
from actions.models.webhooks import WebhookEvent, WebhookEventOutcome
from actions.models.workflows import (
    LIVE_WORKFLOW_STATES,
    Workflow,
    WorkflowEvent,
    WorkflowState,
    WorkflowStep,
)

__all__ = [
    "LIVE_WORKFLOW_STATES",
    "Action",
    "ActionEvent",
    "ActionKind",
    "ActionStatus",
    "ActorKind",
    "AdjustmentReason",
    "AdjustmentRequest",
    "Agent",
    "AgentToken",
    "AgentWebhook",
    "AgentWebhookAttempt",
    "AgentWebhookDelivery",
    "ArchivedActionEvent",
    "Attempt",
    "AttemptKind",
    "Bill",
    "Checkpoint",
    "DeliveryStatus",
    "Discrepancy",
    "DiscrepancyKind",
    "DiscrepancyStatus",
    "FollowUpStatus",
    "LedgerAuditCursor",
    "LedgerAuditRun",
    "Notification",
    "NotificationKind",
    "NotificationSent",
    "Order",
    "OrderEvent",
    "OrderEventKind",
    "OutsideRefund",
    "OwnerGroup",
    "RateCounter",
    "ReasonCode",
    "RefundRequest",
    "Remedy",
    "RemedyKind",
    "RequestSource",
    "RetentionTombstone",
    "SchedulePeriod",
    "SecurityEvent",
    "SecurityEventKind",
    "Supplier",
    "SupplierContact",
    "UserSettings",
    "WebhookEvent",
    "WebhookEventOutcome",
    "Workflow",
    "WorkflowEvent",
    "WorkflowState",
    "WorkflowStep",
]
