"""The human-readable docs page, rendered on the server from the OpenAPI document.

django-ninja's Swagger UI loads its JavaScript and CSS from a CDN unless ``ninja`` is in
INSTALLED_APPS (``ninja.openapi.docs.render_template``), and even then it is a JavaScript
application. This page is plain HTML with inline CSS built from the very document served at
``openapi.json``: it loads nothing from anywhere (its Content-Security-Policy says so), works
without JavaScript, and cannot disagree with the contract.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.http import HttpRequest, HttpResponse
from django.template import engines
from ninja.openapi.docs import DocsBase

from actions.api.problems import KINDS, PROBLEM_CONTENT_TYPE

if TYPE_CHECKING:
    from ninja import NinjaAPI

# Nothing may load from elsewhere: no scripts at all, styles only inline.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }} (v{{ version }})</title>
<style>
body { font: 15px/1.5 system-ui, sans-serif; margin: 0 auto; max-width: 60rem; padding: 1rem 1.5rem 4rem; }
h1 { margin-bottom: 0; } h2 { border-bottom: 1px solid #ddd; margin-top: 2.5rem; }
h3 { margin: 2rem 0 .25rem; font-family: ui-monospace, monospace; }
.method { display: inline-block; min-width: 3.5rem; padding: 0 .4rem; border-radius: 4px; color: #fff; }
.get { background: #1f6feb; } .post { background: #1a7f37; }
table { border-collapse: collapse; width: 100%; margin: .5rem 0; }
td, th { border: 1px solid #ddd; padding: .3rem .5rem; text-align: left; vertical-align: top; }
pre { background: #f6f8fa; padding: .75rem; overflow-x: auto; font-size: 13px; }
code { font-family: ui-monospace, monospace; } .muted { color: #666; } .desc { white-space: pre-line; }
/* A phone: long paths and schema names wrap, and a wide table scrolls inside itself, never the page. */
body { overflow-wrap: anywhere; }
@media (max-width: 640px) { body { padding: 1rem .75rem 3rem; } table { display: block; overflow-x: auto; } }
</style>
</head>
<body>
<h1>{{ title }}</h1>
<p class="muted">Version {{ version }} &middot;
OpenAPI document: <a href="{{ openapi_url }}">{{ openapi_url }}</a></p>
<p class="desc">{{ description }}</p>

<h2 id="operations">Operations</h2>
{% for op in operations %}
<h3 id="{{ op.anchor }}"><span class="method {{ op.method }}">{{ op.method|upper }}</span> {{ op.path }}</h3>
<p><strong>{{ op.summary }}</strong></p>
<p class="desc">{{ op.description }}</p>
{% if op.parameters %}
<table><tr><th>Parameter</th><th>In</th><th>Required</th><th>Schema</th><th>Description</th></tr>
{% for p in op.parameters %}<tr>
<td><code>{{ p.name }}</code></td><td>{{ p.in }}</td><td>{{ p.required|yesno:"yes,no" }}</td>
<td><code>{{ p.schema }}</code></td><td>{{ p.description }}</td>
</tr>{% endfor %}
</table>
{% endif %}
{% if op.body %}
<p>Request body (<code>application/json</code>): <a href="#schema-{{ op.body }}"><code>{{ op.body }}</code></a></p>
{% endif %}
<table><tr><th>Status</th><th>Meaning</th><th>Body</th></tr>
{% for r in op.responses %}<tr>
<td>{{ r.status }}</td><td>{{ r.description }}</td>
<td>{% if r.schema %}<code>{{ r.content_type }}</code>
<a href="#schema-{{ r.schema }}"><code>{{ r.schema }}</code></a>{% endif %}</td>
</tr>{% endfor %}
</table>
{% endfor %}

<h2 id="problems">Problems</h2>
<p>Every error is a problem document (<code>{{ problem_content_type }}</code>, RFC 9457).
Its <code>type</code> links to one of these entries.</p>
<table><tr><th>Type</th><th>Status</th><th>Title</th><th>What to do</th></tr>
{% for kind in problems %}<tr id="problem-{{ kind.slug }}">
<td><code>{{ kind.slug }}</code></td><td>{{ kind.status }}</td><td>{{ kind.title }}</td><td>{{ kind.advice }}</td>
</tr>{% endfor %}
</table>

<h2 id="schemas">Schemas</h2>
{% for s in schemas %}
<h3 id="schema-{{ s.name }}">{{ s.name }}</h3>
<pre>{{ s.json }}</pre>
{% endfor %}
</body>
</html>
"""


def _ref_name(schema: dict[str, Any] | None) -> str | None:
    if not schema:
        return None
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return ref.rsplit("/", 1)[-1]
    return None


def _type_label(schema: dict[str, Any]) -> str:
    if "anyOf" in schema:
        return " | ".join(_type_label(option) for option in schema["anyOf"])
    if schema.get("type") == "array":
        return f"array of {_type_label(schema.get('items', {}))}"
    if "enum" in schema:
        return " | ".join(str(value) for value in schema["enum"])
    return str(schema.get("type") or _ref_name(schema) or "any")


def docs_context(document: dict[str, Any], *, openapi_url: str) -> dict[str, Any]:
    operations = []
    for path, methods in document.get("paths", {}).items():
        for method, operation in methods.items():
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            responses = []
            for status, response in sorted(operation.get("responses", {}).items()):
                contents: dict[str, dict[str, Any]] = response.get("content", {})
                content_type, media = next(iter(contents.items()), ("", {}))
                responses.append(
                    {
                        "status": status,
                        "description": response.get("description", ""),
                        "content_type": content_type,
                        "schema": _ref_name(media.get("schema")),
                    }
                )
            operations.append(
                {
                    "anchor": operation.get("operationId", f"{method}-{path}"),
                    "method": method,
                    "path": path,
                    "summary": operation.get("summary", ""),
                    "description": operation.get("description", ""),
                    "parameters": [
                        {
                            "name": p.get("name"),
                            "in": p.get("in"),
                            "required": p.get("required", False),
                            "schema": _type_label(p.get("schema", {})),
                            "description": p.get("description", ""),
                        }
                        for p in operation.get("parameters", [])
                    ],
                    "body": _ref_name(body),
                    "responses": responses,
                }
            )
    schemas = [
        {"name": name, "json": json.dumps(schema, indent=2, ensure_ascii=False)}
        for name, schema in sorted(document.get("components", {}).get("schemas", {}).items())
    ]
    info = document.get("info", {})
    return {
        "title": info.get("title", ""),
        "version": info.get("version", ""),
        "description": info.get("description", ""),
        "openapi_url": openapi_url,
        "operations": operations,
        "schemas": schemas,
        "problems": list(KINDS.values()),
        "problem_content_type": PROBLEM_CONTENT_TYPE,
    }


class SelfContainedDocs(DocsBase):
    def render_page(self, request: HttpRequest, api: NinjaAPI, **kwargs: Any) -> HttpResponse:
        document = api.get_openapi_schema(path_params=kwargs)
        context = docs_context(document, openapi_url=self.get_openapi_url(api, kwargs))
        html = engines["django"].from_string(_TEMPLATE).render(context)
        response = HttpResponse(html, content_type="text/html; charset=utf-8")
        response["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
        return response
