"""Orders for an agent: a shop's commerce system sends its orders (scope ``orders``).

Orders are not any one agent's: every agent with the scope sends and updates the same orders,
so there is no ownership to hide here, only the scope.
"""

from __future__ import annotations

from actions.agents.services import ORDERS_SCOPE
from actions.kinds.fields import FieldProblem, ProposalInvalid
from actions.models import Agent
from actions.orders.services import OrderBusy, OrderConflict, OrderResult, order_data_check, order_upsert
from actions.proposals.outcomes import Conflict, invalid
from actions.proposals.rules import scope_require


def agent_order_upsert(*, agent: Agent, order_number: str, **fields: object) -> OrderResult:
    """Create or update an order by its number (the other ``fields`` as ``order_data_check``
    takes them); a change that cannot apply is a conflict naming its field."""
    scope_require(agent, ORDERS_SCOPE, doing="send orders")
    try:
        data = order_data_check(number=order_number, **fields)
        return order_upsert(data=data, source=f"agent:{agent.name}")
    except ProposalInvalid as problems:
        raise invalid(problems.problems) from None
    except OrderConflict as conflict:
        raise Conflict(
            code=conflict.code,
            detail=conflict.message,
            errors=[FieldProblem(conflict.field, conflict.code, conflict.message)],
        ) from None
    except OrderBusy as busy:
        raise Conflict(code="order_busy", detail=str(busy)) from None
