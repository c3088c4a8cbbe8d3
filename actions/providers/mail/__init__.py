"""Mail: the SMTP adapter behind the supplier-email kind, and the mail sandbox (``sandbox``)."""

from __future__ import annotations
