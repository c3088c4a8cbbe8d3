"""URLs of the agent API, mounted at ``/api/v1/`` by ``console.urls``.

django-ninja's URL patterns, each wrapped in the gateway (``actions.api.gateway``), plus a
last pattern that answers any other URL under the API with a problem document.
"""

from __future__ import annotations

from django.urls import URLPattern, re_path

# Importing these modules registers their operations on ``api``.
from actions.api import adjustments, workflows  # noqa: F401
from actions.api.gateway import api_view, not_found
from actions.api.views import api

app_name = "api-v1"

# The OpenAPI document and the docs page are public and read-only; "api-root" is ninja's
# placeholder for the API's root URL (a 404) that it needs to compute the document's paths.
_PUBLIC = {"openapi-json": frozenset({"GET", "HEAD"}), "openapi-view": frozenset({"GET", "HEAD"}), "api-root": None}


def _operation_methods() -> dict[str, frozenset[str]]:
    """The methods each operation URL accepts, so that the gateway answers 405 before it
    authenticates or reads a body."""
    methods: dict[str, frozenset[str]] = {}
    for path_view in api.default_router.path_operations.values():
        accepted = frozenset(method for operation in path_view.operations for method in operation.methods)
        for operation in path_view.operations:
            url_name = getattr(operation, "url_name", None)
            if url_name:
                methods[url_name] = accepted
    return methods


def _patterns() -> list[URLPattern]:
    ninja_patterns, _, _ = api.urls
    methods = _operation_methods()
    result = []
    for pattern in ninja_patterns:
        assert isinstance(pattern, URLPattern)
        name = pattern.name or ""
        if name in _PUBLIC:
            view = api_view(pattern.callback, authenticated=False, methods=_PUBLIC[name], limited=False)
        else:
            view = api_view(pattern.callback, methods=methods.get(name))
        result.append(URLPattern(pattern.pattern, view, pattern.default_args, pattern.name))
    return result


urlpatterns = [
    *_patterns(),
    re_path(r"^.*$", api_view(not_found, authenticated=False), name="not-found"),
]
