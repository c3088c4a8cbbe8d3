"""What an agent may do, in one place for every interface that serves agents.

Each agent-facing operation (open a refund or adjustment request, propose a refund, an invoice
adjustment, a supplier email or a workflow, send an order, read, list and explain its actions
and workflows) is one function here, named ``agent_<entity>_<verb>``. It enforces the agent's
scope, resolves a request by reference, hides every other agent's requests, actions and
workflows (they read exactly as ones that do not exist), decides "proposed elsewhere", and
answers with a typed result or raises one ``AgentRefusal`` (``actions.proposals.outcomes``).

The REST API (``actions.api``) and the MCP server (``actions.mcp``) call these and keep only
transport: they parse, map a refusal's ``outcome`` to a status code or a tool error, and
document. So the two cannot disagree on a rule: there is one copy of it.
"""

from __future__ import annotations
