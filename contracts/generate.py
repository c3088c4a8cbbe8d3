"""Build the published contract from the code: the OpenAPI document and the MCP tools' input
schemas, as JSON-ready dictionaries.

Run from a checkout (its directory first on ``sys.path``) to write that checkout's contract,
for instance an older commit's in a ``git worktree``::

    python -m contracts.generate --out /tmp/contract-at-abc123

Needs Django's settings but no database connection and no server: the document is the one
django-ninja serves at ``/api/v1/openapi.json``, and the tools are the ones the MCP server lists.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
from pathlib import Path
from typing import Any


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()


def openapi_document() -> dict[str, Any]:
    """The REST API's OpenAPI document, as served (path prefix included)."""
    _setup()
    # The URL module registers every operation (some live in modules of their own) and ninja
    # reverses the API's root through it to prefix the paths.
    importlib.import_module("actions.api.urls")
    api = importlib.import_module("actions.api.views").api
    schema = api.get_openapi_schema()
    return json.loads(json.dumps(schema, default=str))


def mcp_tools() -> dict[str, Any]:
    """Each MCP tool's input schema by tool name, as ``tools/list`` advertises it; empty for a
    checkout without an MCP server."""
    _setup()
    try:
        server_module = importlib.import_module("actions.mcp.server")
    except ModuleNotFoundError:
        return {}
    tools = asyncio.run(server_module.mcp_server().list_tools())
    return {tool.name: {"inputSchema": json.loads(json.dumps(tool.input_schema, default=str))} for tool in tools}


def dumps(document: dict[str, Any]) -> str:
    """The snapshots' one format: two-space indents, sorted keys, a final newline."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="A directory for openapi-v1.json and mcp-tools.json.")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "openapi-v1.json").write_text(dumps(openapi_document()))
    (args.out / "mcp-tools.json").write_text(dumps(mcp_tools()))
    print(f"wrote {args.out}/openapi-v1.json and {args.out}/mcp-tools.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
