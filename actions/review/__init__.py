"""Finance's side: the review queue and its rules (who owns what, when it is due), taking,
reassigning and resolving items (services), the admins' corrections, and the exports."""

from __future__ import annotations
