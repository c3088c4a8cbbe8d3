"""Tools around the console, not the console: what proves it and what stands in for the
outside world during development, demos and tests.

- ``chaos``: the chaos run (``manage.py chaos_run``): thousands of actions of every kind
  against real worker processes, with workers killed and receiver faults on, then an audit of
  every invariant against the receivers' own ledgers.
- ``sandboxes``: stand-ins for the receivers, each its own process: a Stripe-compatible
  payment provider (``payment``), a Xero-compatible accounting system (``accounting``) and an
  SMTP relay that keeps what it gets (``mail``), with fault injection.
- ``demo``: the demo's seeded people, orders, bills and actions (``manage.py seed_demo``).

The console's own code (``actions``, ``approvals``, ``console``) never imports from here;
import-linter holds that line (pyproject.toml).
"""

from __future__ import annotations
