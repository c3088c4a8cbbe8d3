"""The console's MCP server: the agent API's operations as Model Context Protocol tools.

``tools`` holds the operations as plain synchronous functions over the services (testable
without a transport); ``server`` turns them into MCP tools on the official SDK, served over
streamable HTTP behind the agent's bearer token. ``python manage.py mcp_serve`` runs it as a
process of its own (README: "Agents over MCP").
"""

from __future__ import annotations
