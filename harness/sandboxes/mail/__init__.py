"""An SMTP relay that keeps every message it accepts, for development, demos and tests.

Run it with ``python -m harness.sandboxes.mail``; the console's SMTP adapter is
``actions.providers.mail``.
"""

from __future__ import annotations
