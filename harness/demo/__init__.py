"""The demo's seeded data, for ``manage.py seed_demo``."""

from __future__ import annotations
