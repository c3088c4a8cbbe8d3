"""The payment provider's events (its webhooks): verified, stored once, applied (services), and
the endpoint that receives them (views)."""

from __future__ import annotations
