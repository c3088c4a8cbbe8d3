"""A Xero-compatible accounting system for development, demos and tests, with fault injection.

Run it with ``python -m harness.sandboxes.accounting``; the console's client for the real
service is ``actions.providers.accounting.client``.
"""

from __future__ import annotations
