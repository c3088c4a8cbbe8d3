"""Orders and their money: the shop's orders as they arrive (services), the charges imported from
the payment provider (charges), and the order page (selectors, views)."""

from __future__ import annotations
