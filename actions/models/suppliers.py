"""Suppliers and the addresses the console may write to on their behalf.

A supplier email goes only to one of its supplier's known contacts: the agent names the
address, and deterministic code checks it against this list at proposal time and again at the
claim (through the supplier's ``version``, which an approval binds).
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Lower


class Supplier(models.Model):
    """A business the console writes to. ``version`` is bumped by every change to its contacts,
    so an approval given against one list of contacts does not survive a change to it."""

    code = models.CharField(max_length=32, unique=True, help_text="The supplier's reference, as agents name it.")
    name = models.CharField(max_length=200)
    version = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["code"]

    def __str__(self) -> str:
        return f"{self.name} ({self.code})"

    def known_addresses(self) -> set[str]:
        return {address.lower() for address in self.contacts.filter(active=True).values_list("email", flat=True)}


class SupplierContact(models.Model):
    supplier = models.ForeignKey(Supplier, on_delete=models.CASCADE, related_name="contacts")
    email = models.EmailField()
    name = models.CharField(max_length=200, blank=True)
    active = models.BooleanField(default=True)

    class Meta:
        ordering = ["supplier", "email"]
        constraints = [
            models.UniqueConstraint(Lower("email"), "supplier", name="supplier_contact_email_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.name} <{self.email}>" if self.name else self.email
