"""Classify the difference between two versions of the contract: breaking or additive.

A change is **breaking** when a client written against the old contract may fail against the
new one without changing a line:

- a removed path, operation, MCP tool, request field or tool argument, response field;
- a new required request field or argument, or an optional one becoming required;
- a narrowed request type, enum, pattern, format or length/range limit (the client's old
  values may now be refused), or a widened response type (the client may not read it);
- a changed set of status codes, or a changed content type, on an operation.

A change is **additive** when old clients cannot notice it: a new path, operation or tool, a
new optional field or argument, a request field becoming optional, a widened request enum or
limit, a new response field, a new value in a response enum (clients are told in
docs/api-versions.md to accept unknown values).

Descriptions, titles and examples are documentation, not contract, and are not compared.

Each change has a stable ``key`` (``openapi POST /api/v1/refund-requests request.reason_code:
became required``); ``declared_breaks.json`` names the breaking changes a release accepts by
those keys.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Severity = Literal["breaking", "additive"]
# Request schemas are what the client sends: narrowing breaks. Response schemas are what the
# client reads: widening breaks.
Direction = Literal["request", "response"]

HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
# Limits that refuse more values when they go up (minimums) or down (maximums).
_LOWER_BOUNDS = ("minLength", "minimum", "exclusiveMinimum", "minItems", "minProperties")
_UPPER_BOUNDS = ("maxLength", "maximum", "exclusiveMaximum", "maxItems", "maxProperties")


@dataclass(frozen=True)
class Change:
    severity: Severity
    where: str
    what: str

    @property
    def key(self) -> str:
        return f"{self.where}: {self.what}"

    def __str__(self) -> str:
        return f"{self.severity:8} {self.key}"


Resolver = Callable[[Any], Any]


def _resolver(document: dict[str, Any]) -> Resolver:
    def resolve(schema: Any) -> Any:
        seen: set[str] = set()
        while isinstance(schema, dict) and "$ref" in schema:
            ref = schema["$ref"]
            if ref in seen or not ref.startswith("#/"):
                break
            seen.add(ref)
            target: Any = document
            for part in ref[2:].split("/"):
                target = target.get(part, {}) if isinstance(target, dict) else {}
            # Keywords beside a $ref (pydantic puts a field's description there) still apply.
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = {**target, **rest} if rest else target
        return schema

    return resolve


def _branches(schema: dict[str, Any]) -> list[dict[str, Any]]:
    for keyword in ("anyOf", "oneOf"):
        if keyword in schema:
            return [branch for branch in schema[keyword] if isinstance(branch, dict)]
    return [schema]


def _types(schema: dict[str, Any], resolve: Resolver) -> set[str]:
    """The JSON types a schema admits; ``{"any"}`` when it does not say."""
    types: set[str] = set()
    for branch in _branches(schema):
        branch = resolve(branch)
        if branch is not schema and ("anyOf" in branch or "oneOf" in branch):
            types |= _types(branch, resolve)
            continue
        declared = branch.get("type")
        if isinstance(declared, str):
            types.add(declared)
        elif isinstance(declared, list):
            types.update(declared)
        elif "enum" in branch or "const" in branch:
            values = branch.get("enum", [branch.get("const")])
            types.update(_json_type(value) for value in values)
        else:
            types.add("any")
    # An integer is also a number: "number" -> "integer" narrows, the reverse widens.
    return types


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _admits(types: set[str], other: set[str]) -> bool:
    """True when every type in ``other`` is admitted by ``types``."""
    if "any" in types:
        return True
    return all(t in types or (t == "integer" and "number" in types) for t in other)


def _enum(schema: dict[str, Any], resolve: Resolver) -> set[Any] | None:
    """The values an enumerated schema admits (null included for a nullable one); None when
    any value of its type is admitted."""
    values: set[Any] = set()
    for branch in _branches(schema):
        branch = resolve(branch)
        if "enum" in branch:
            values.update(json.dumps(v, sort_keys=True) for v in branch["enum"])
        elif "const" in branch:
            values.add(json.dumps(branch["const"], sort_keys=True))
        elif branch.get("type") == "null":
            values.add("null")
        else:
            return None
    return values


def _part(schema: dict[str, Any], resolve: Resolver, type_name: str) -> dict[str, Any] | None:
    """The branch of a schema that describes values of one type (its object or array part)."""
    for branch in _branches(schema):
        branch = resolve(branch)
        if branch.get("type") == type_name or (type_name == "object" and "properties" in branch):
            return branch
    return None


def schema_changes(
    old: Any, new: Any, *, where: str, at: str, direction: Direction, old_resolve: Resolver, new_resolve: Resolver
) -> Iterator[Change]:
    """The changes between two JSON Schemas of one value, ``at`` naming the value."""
    old, new = old_resolve(old), new_resolve(new)
    if not isinstance(old, dict) or not isinstance(new, dict):
        return
    narrows: Severity = "breaking" if direction == "request" else "additive"
    widens: Severity = "additive" if direction == "request" else "breaking"

    old_types, new_types = _types(old, old_resolve), _types(new, new_resolve)
    if old_types != new_types:
        if _admits(new_types, old_types):
            yield Change(widens, where, f"{at}: type widened from {_fmt(old_types)} to {_fmt(new_types)}")
        elif _admits(old_types, new_types):
            yield Change(narrows, where, f"{at}: type narrowed from {_fmt(old_types)} to {_fmt(new_types)}")
        else:
            yield Change("breaking", where, f"{at}: type changed from {_fmt(old_types)} to {_fmt(new_types)}")
        return

    old_enum, new_enum = _enum(old, old_resolve), _enum(new, new_resolve)
    if old_enum != new_enum:
        if old_enum is None:
            yield Change(narrows, where, f"{at}: became an enum of {_fmt(new_enum or set())}")
        elif new_enum is None:
            yield Change(widens, where, f"{at}: is no longer an enum")
        else:
            for value in sorted(old_enum - new_enum):
                yield Change(narrows, where, f"{at}: enum value {value} removed")
            for value in sorted(new_enum - old_enum):
                # A new value in a response enum is announced, not breaking: docs/api-versions.md
                # asks clients to read unknown values as "not known to this client".
                yield Change("additive", where, f"{at}: enum value {value} added")

    yield from _keyword_changes(old, new, where=where, at=at, narrows=narrows, widens=widens)

    old_object, new_object = _part(old, old_resolve, "object"), _part(new, new_resolve, "object")
    if old_object is not None and new_object is not None:
        yield from _object_changes(
            old_object,
            new_object,
            where=where,
            at=at,
            direction=direction,
            old_resolve=old_resolve,
            new_resolve=new_resolve,
        )
    old_array, new_array = _part(old, old_resolve, "array"), _part(new, new_resolve, "array")
    if old_array is not None and new_array is not None and "items" in old_array and "items" in new_array:
        yield from schema_changes(
            old_array["items"],
            new_array["items"],
            where=where,
            at=f"{at}[]",
            direction=direction,
            old_resolve=old_resolve,
            new_resolve=new_resolve,
        )


def _keyword_changes(
    old: dict[str, Any], new: dict[str, Any], *, where: str, at: str, narrows: Severity, widens: Severity
) -> Iterator[Change]:
    merged_old = _merged(old)
    merged_new = _merged(new)
    for keyword in ("pattern", "format"):
        before, after = merged_old.get(keyword), merged_new.get(keyword)
        if before == after:
            continue
        if before is None:
            yield Change(narrows, where, f"{at}: {keyword} {after!r} added")
        elif after is None:
            yield Change(widens, where, f"{at}: {keyword} {before!r} removed")
        else:
            # Whether one pattern admits all of another's strings is not decidable here: a
            # changed pattern is breaking in both directions.
            yield Change("breaking", where, f"{at}: {keyword} changed from {before!r} to {after!r}")
    for keyword in (*_LOWER_BOUNDS, *_UPPER_BOUNDS):
        before, after = merged_old.get(keyword), merged_new.get(keyword)
        if before == after:
            continue
        tighter = after is not None and (
            before is None or (after > before if keyword in _LOWER_BOUNDS else after < before)
        )
        yield Change(narrows if tighter else widens, where, f"{at}: {keyword} changed from {before} to {after}")


def _merged(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema's own keywords plus those of its non-null branches (for ``X | None``)."""
    merged = dict(schema)
    for branch in _branches(schema):
        if branch is not schema and branch.get("type") != "null":
            for key, value in branch.items():
                merged.setdefault(key, value)
    return merged


def _object_changes(
    old: dict[str, Any],
    new: dict[str, Any],
    *,
    where: str,
    at: str,
    direction: Direction,
    old_resolve: Resolver,
    new_resolve: Resolver,
) -> Iterator[Change]:
    old_props: dict[str, Any] = old.get("properties", {})
    new_props: dict[str, Any] = new.get("properties", {})
    old_required, new_required = set(old.get("required", [])), set(new.get("required", []))
    prefix = f"{at}." if at else ""
    for name in sorted(old_props.keys() - new_props.keys()):
        # A request body that forbids unknown fields refuses the removed one; a client that
        # reads a response field finds it gone.
        yield Change("breaking", where, f"{prefix}{name}: removed")
    for name in sorted(new_props.keys() - old_props.keys()):
        if direction == "request" and name in new_required:
            yield Change("breaking", where, f"{prefix}{name}: added as required")
        else:
            yield Change("additive", where, f"{prefix}{name}: added")
    for name in sorted(old_props.keys() & new_props.keys()):
        was, now = name in old_required, name in new_required
        if was != now:
            if direction == "request":
                severity: Severity = "breaking" if now else "additive"
            else:
                severity = "breaking" if was else "additive"
            yield Change(severity, where, f"{prefix}{name}: became {'required' if now else 'optional'}")
        yield from schema_changes(
            old_props[name],
            new_props[name],
            where=where,
            at=f"{prefix}{name}",
            direction=direction,
            old_resolve=old_resolve,
            new_resolve=new_resolve,
        )
    old_extra, new_extra = old.get("additionalProperties", True), new.get("additionalProperties", True)
    if old_extra is not False and new_extra is False and direction == "request":
        yield Change("breaking", where, f"{at or 'body'}: unknown fields are now refused")


def _fmt(values: set[str]) -> str:
    return "|".join(sorted(values))


# --- OpenAPI ----------------------------------------------------------------------------------


def openapi_changes(old: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    old_resolve, new_resolve = _resolver(old), _resolver(new)
    changes: list[Change] = []
    old_paths: dict[str, Any] = old.get("paths", {})
    new_paths: dict[str, Any] = new.get("paths", {})
    for path in sorted(old_paths.keys() - new_paths.keys()):
        changes.append(Change("breaking", f"openapi {path}", "path removed"))
    for path in sorted(new_paths.keys() - old_paths.keys()):
        changes.append(Change("additive", f"openapi {path}", "path added"))
    for path in sorted(old_paths.keys() & new_paths.keys()):
        for method in HTTP_METHODS:
            before, after = old_paths[path].get(method), new_paths[path].get(method)
            where = f"openapi {method.upper()} {path}"
            if before is None and after is None:
                continue
            if after is None:
                changes.append(Change("breaking", where, "operation removed"))
            elif before is None:
                changes.append(Change("additive", where, "operation added"))
            else:
                changes.extend(_operation_changes(before, after, where, old_resolve, new_resolve))
    return changes


def _operation_changes(
    old: dict[str, Any], new: dict[str, Any], where: str, old_resolve: Resolver, new_resolve: Resolver
) -> Iterator[Change]:
    yield from _parameter_changes(old, new, where, old_resolve, new_resolve)

    old_body, new_body = old_resolve(old.get("requestBody")), new_resolve(new.get("requestBody"))
    if old_body and not new_body:
        yield Change("breaking", where, "request body removed")
    elif new_body and not old_body:
        severity: Severity = "breaking" if new_body.get("required") else "additive"
        yield Change(severity, where, "request body added")
    elif old_body and new_body:
        if new_body.get("required") and not old_body.get("required"):
            yield Change("breaking", where, "request body became required")
        yield from _content_changes(
            old_body.get("content", {}),
            new_body.get("content", {}),
            where,
            "request",
            "request",
            old_resolve,
            new_resolve,
        )

    old_responses: dict[str, Any] = old.get("responses", {})
    new_responses: dict[str, Any] = new.get("responses", {})
    for status in sorted(old_responses.keys() - new_responses.keys()):
        yield Change("breaking", where, f"status {status} removed")
    for status in sorted(new_responses.keys() - old_responses.keys()):
        # A status a client has never seen is one it does not handle.
        yield Change("breaking", where, f"status {status} added")
    for status in sorted(old_responses.keys() & new_responses.keys()):
        yield from _content_changes(
            old_resolve(old_responses[status]).get("content", {}),
            new_resolve(new_responses[status]).get("content", {}),
            where,
            f"response {status}",
            "response",
            old_resolve,
            new_resolve,
        )


def _parameter_changes(
    old: dict[str, Any], new: dict[str, Any], where: str, old_resolve: Resolver, new_resolve: Resolver
) -> Iterator[Change]:
    def by_name(operation: dict[str, Any], resolve: Resolver) -> dict[tuple[str, str], dict[str, Any]]:
        params = (resolve(p) for p in operation.get("parameters", []))
        return {(p.get("in", ""), p.get("name", "")): p for p in params if isinstance(p, dict)}

    old_params, new_params = by_name(old, old_resolve), by_name(new, new_resolve)
    for location, name in sorted(old_params.keys() - new_params.keys()):
        # The API refuses unknown query parameters: a client still sending it is refused.
        yield Change("breaking", where, f"{location} parameter {name}: removed")
    for location, name in sorted(new_params.keys() - old_params.keys()):
        severity: Severity = "breaking" if new_params[(location, name)].get("required") else "additive"
        added = "added as required" if severity == "breaking" else "added"
        yield Change(severity, where, f"{location} parameter {name}: {added}")
    for key in sorted(old_params.keys() & new_params.keys()):
        before, after = old_params[key], new_params[key]
        label = f"{key[0]} parameter {key[1]}"
        if after.get("required") and not before.get("required"):
            yield Change("breaking", where, f"{label}: became required")
        elif before.get("required") and not after.get("required"):
            yield Change("additive", where, f"{label}: became optional")
        yield from schema_changes(
            before.get("schema", {}),
            after.get("schema", {}),
            where=where,
            at=label,
            direction="request",
            old_resolve=old_resolve,
            new_resolve=new_resolve,
        )


def _content_changes(
    old: dict[str, Any],
    new: dict[str, Any],
    where: str,
    at: str,
    direction: Direction,
    old_resolve: Resolver,
    new_resolve: Resolver,
) -> Iterator[Change]:
    for content_type in sorted(old.keys() - new.keys()):
        yield Change("breaking", where, f"{at}: content type {content_type} removed")
    for content_type in sorted(new.keys() - old.keys()):
        yield Change("breaking", where, f"{at}: content type {content_type} added")
    for content_type in sorted(old.keys() & new.keys()):
        yield from schema_changes(
            old[content_type].get("schema", {}),
            new[content_type].get("schema", {}),
            where=where,
            at=at,
            direction=direction,
            old_resolve=old_resolve,
            new_resolve=new_resolve,
        )


# --- MCP tools --------------------------------------------------------------------------------


def mcp_changes(old: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    changes: list[Change] = []
    for name in sorted(old.keys() - new.keys()):
        changes.append(Change("breaking", f"mcp {name}", "tool removed"))
    for name in sorted(new.keys() - old.keys()):
        changes.append(Change("additive", f"mcp {name}", "tool added"))
    for name in sorted(old.keys() & new.keys()):
        old_schema, new_schema = old[name].get("inputSchema", {}), new[name].get("inputSchema", {})
        changes.extend(
            schema_changes(
                old_schema,
                new_schema,
                where=f"mcp {name}",
                at="arguments",
                direction="request",
                old_resolve=_resolver(old_schema),
                new_resolve=_resolver(new_schema),
            )
        )
    return changes


# --- declared breaks --------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    changes: list[Change]
    undeclared: list[Change]

    @property
    def ok(self) -> bool:
        return not self.undeclared

    def report(self) -> str:
        if not self.changes:
            return "No change in the contract."
        lines = [str(change) for change in self.changes]
        declared = [c for c in self.changes if c.severity == "breaking" and c not in self.undeclared]
        summary = (
            f"{sum(c.severity == 'additive' for c in self.changes)} additive, "
            f"{len(declared)} breaking and declared, {len(self.undeclared)} breaking and NOT declared"
        )
        if self.undeclared:
            lines.append(
                "Undeclared breaking changes: a client written against the snapshot may fail. Keep the old "
                "behaviour (docs/api-versions.md), or declare each key in contracts/declared_breaks.json with "
                "the reason and the version that introduces it."
            )
        return "\n".join([*lines, summary])


def declared_keys(declared: list[dict[str, Any]]) -> set[str]:
    """The keys of the declared breaks; each entry needs a key, a reason and a version."""
    keys = set()
    for entry in declared:
        missing = [field for field in ("change", "reason", "version") if not str(entry.get(field, "")).strip()]
        if missing:
            raise ValueError(f"A declared break lacks {', '.join(missing)}: {entry!r}")
        keys.add(entry["change"])
    return keys


def contract_verdict(
    *,
    old_openapi: dict[str, Any],
    new_openapi: dict[str, Any],
    old_mcp: dict[str, Any],
    new_mcp: dict[str, Any],
    declared: list[dict[str, Any]],
) -> Verdict:
    changes = [*openapi_changes(old_openapi, new_openapi), *mcp_changes(old_mcp, new_mcp)]
    accepted = declared_keys(declared)
    undeclared = [c for c in changes if c.severity == "breaking" and c.key not in accepted]
    return Verdict(changes=changes, undeclared=undeclared)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Compare two contracts (directories written by contracts.generate).")
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--declared", type=Path, help="A declared_breaks.json (none by default).")
    args = parser.parse_args(argv)

    def load(directory: Path, name: str) -> dict[str, Any]:
        path = directory / name
        return json.loads(path.read_text()) if path.exists() else {}

    verdict = contract_verdict(
        old_openapi=load(args.old, "openapi-v1.json"),
        new_openapi=load(args.new, "openapi-v1.json"),
        old_mcp=load(args.old, "mcp-tools.json"),
        new_mcp=load(args.new, "mcp-tools.json"),
        declared=json.loads(args.declared.read_text()) if args.declared else [],
    )
    print(verdict.report())
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
