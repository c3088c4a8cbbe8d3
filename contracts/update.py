"""Rewrite the contract's snapshots from the code: ``python -m contracts.update``.

Additive changes are written at once. While the code has a breaking change that
``declared_breaks.json`` does not declare, nothing is written and the command fails, naming
each change: keep the old behaviour for old clients (docs/api-versions.md), or declare it.
"""

from __future__ import annotations

import json
import sys

from contracts import DECLARED_BREAKS, MCP_SNAPSHOT, OPENAPI_SNAPSHOT
from contracts.compare import contract_verdict
from contracts.generate import dumps, mcp_tools, openapi_document


def main() -> int:
    openapi, mcp = openapi_document(), mcp_tools()
    verdict = contract_verdict(
        old_openapi=json.loads(OPENAPI_SNAPSHOT.read_text()) if OPENAPI_SNAPSHOT.exists() else {},
        new_openapi=openapi,
        old_mcp=json.loads(MCP_SNAPSHOT.read_text()) if MCP_SNAPSHOT.exists() else {},
        new_mcp=mcp,
        declared=json.loads(DECLARED_BREAKS.read_text()),
    )
    print(verdict.report())
    if not verdict.ok:
        print("Nothing written.", file=sys.stderr)
        return 1
    OPENAPI_SNAPSHOT.write_text(dumps(openapi))
    MCP_SNAPSHOT.write_text(dumps(mcp))
    print(f"Wrote {OPENAPI_SNAPSHOT.name} and {MCP_SNAPSHOT.name}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
