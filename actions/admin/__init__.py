"""The admin site: for corrections, not for rewriting history.

- Material fields and the audit trail are read-only (invariants 4 and 9). An action's change
  form saves nothing: every change to an action goes through a service that writes its audit
  event in the same transaction.
- State changes use django-fsm-2's FSMAdminMixin, but only for transitions that carry a
  permission, that the person holds, and that have a service here (cancel, reopen). The
  mixin's hook that performs the transition is replaced by a call to that service. Worker
  transitions (begin_submission, record_*, mark_unknown, escalate...) have no permission and
  are never offered.
- Only admins correct (invariant 10): the correction views and actions need
  ``actions.correct_action``, whatever other permissions a person holds.
- Remedies and discrepancies are worked by finance in the review queue, whose services keep
  their status flow and trail; here they are read-only, except an admin's reassignment and the
  compensating action for a duplicate effect (``actions.review.corrections``).
- Big tables never run an exact COUNT(*) (see ``EstimatedCountPaginator``), nor list filter
  choices with a SELECT DISTINCT over the whole table (see ``FixedChoicesFilter``).
"""

from __future__ import annotations

# Each module registers its admins with the site on import.
from actions.admin import actions, agents, followups, orders  # noqa: F401
