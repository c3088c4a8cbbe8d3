"""The agent interfaces' published contract, kept as snapshots beside the code.

``openapi-v1.json`` is the REST API's OpenAPI document as ``/api/v1/openapi.json`` serves it,
``mcp-tools.json`` the MCP tools' input schemas as ``tools/list`` advertises them; both are
pretty-printed with sorted keys so that a change reads as a diff in review.

- ``contracts.generate`` builds both documents from the code (no database, no server).
- ``contracts.compare`` classifies the difference between two versions of them: breaking
  (a client written against the old one may fail) or additive.
- ``contracts.update`` (``python -m contracts.update``) rewrites the snapshots, and refuses
  while a breaking change is not declared in ``declared_breaks.json``.
- ``tests/contracts`` fails on any undeclared breaking change.

Why a comparison of its own rather than a packaged OpenAPI diff: the maintained one (oasdiff)
is a Go binary; the Python packages that claim the job are young or unmaintained single-author
projects, and none reads MCP tool schemas, which need the same JSON Schema comparison. The
rules here are the ones docs/api-versions.md promises, in about three hundred lines.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
OPENAPI_SNAPSHOT = HERE / "openapi-v1.json"
MCP_SNAPSHOT = HERE / "mcp-tools.json"
DECLARED_BREAKS = HERE / "declared_breaks.json"
