"""Agents: creating them and their tokens, authenticating a token (services), and each agent's
webhook with its deliveries (webhooks)."""

from __future__ import annotations
