"""Permission names, defined once. The roles in ``console.roles`` grant them; services and
transitions check them."""

from __future__ import annotations

PROPOSE = "actions.propose_action"
DECIDE = "actions.decide_action"
CANCEL = "actions.cancel_action"
RESOLVE = "actions.resolve_action"
CORRECT = "actions.correct_action"
CHANGE_REMEDY = "actions.change_remedy"
CHANGE_DISCREPANCY = "actions.change_discrepancy"
