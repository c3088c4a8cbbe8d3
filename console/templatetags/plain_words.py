"""Template filters that put the console's internal names and the receivers' errors into words
a clerk understands (actions.plain). Use: ``{% load plain_words %}``."""

from __future__ import annotations

from typing import Any

from django import template

from actions import plain

register = template.Library()


@register.filter
def transition_words(transition: str, receiver: str = "payment provider") -> str:
    return plain.transition_words(transition, receiver=receiver or "payment provider")


@register.filter
def actor_words(label: str) -> str:
    return plain.actor_words(label)


@register.filter
def binding_words(binding: str) -> str:
    return plain.binding_words(binding)


@register.filter
def error_words(error: Any, receiver: str = "payment provider") -> str:
    return plain.error_words(error, receiver=receiver or "payment provider")


@register.filter
def no_status_codes(text: str) -> str:
    return plain.without_status_codes(str(text))


@register.filter
def evidence_rows(details: Any, currency: str = "") -> list[tuple[str, str]]:
    return plain.evidence_rows(details if isinstance(details, dict) else {}, currency=currency)


@register.filter
def clerk_words(text: Any) -> str:
    return plain.clerk_words(str(text))
