"""Mail: the SMTP adapter behind the supplier-email kind (its sandbox is harness.sandboxes.mail)."""

from __future__ import annotations
