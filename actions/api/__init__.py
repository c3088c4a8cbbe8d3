"""The agent API, mounted at ``/api/v1/``: a public contract for software that proposes actions.

Why django-ninja (and not Django REST framework): the request and response bodies are typed
pydantic schemas, and the same schemas both validate every request and generate the OpenAPI
document served at ``/api/v1/openapi.json``, so the contract and the code cannot drift apart.
For four operations it is also much lighter than DRF: no serializers, viewsets or routers
beside the models, and function views that stay thin interfaces over the services in
``actions.proposals`` (the kinds' proposal services in ``actions.kinds``) and ``actions.selectors``.

What sits in front of django-ninja (``actions.api.gateway``): authentication by bearer token,
the per-token rate limit, the body size cap and the JSON-only rule run before ninja parses
anything, and every error, ninja's own included, leaves as an RFC 9457 problem document.
"""

from __future__ import annotations
