"""How the console shows an amount and a moment, on every page: ``{% money amount currency %}``
and ``{% age time %}``. Built into every template (settings.TEMPLATES' ``builtins``).

These were two ``{% include %}`` templates. A search or a queue page shows a hundred rows with
two or three of them each, and an include costs far more than a call (a new context, a template
lookup, a node walk): at 102 rows they were about half of the search page's time (P-e,
``tests/bench/bench_scale.py``). The output is the same markup the includes wrote.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import template
from django.contrib.humanize.templatetags.humanize import naturaltime
from django.template import Context
from django.template.defaultfilters import date as date_format
from django.utils.dates import MONTHS_3
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.timezone import template_localtime  # type: ignore[attr-defined]  # (missing from the stubs)

from actions.providers.money import money_text

register = template.Library()


@register.simple_tag
def money(amount: Any, currency: Any) -> SafeString:
    """An amount in its currency's usual decimals (none for yen and the like), grouped:
    ``<span class="money">1,250.00 EUR</span>``. The text is ``money_text``'s, as in messages."""
    return format_html('<span class="money">{}</span>', money_text(amount, currency))


register.filter("money_text", money_text)


@register.simple_tag(takes_context=True)
def age(context: Context, time: Any) -> SafeString:
    """How long ago, with the exact time on hover and in print: ``<time ...>3 minutes ago</time>
    <span class="abs-time">(4 Dec 2026, 09:12 UTC)</span>``."""
    if time is None:
        # (The include wrote "None" and empty dates here.)
        return format_html('<span class="muted">{}</span>', "—")
    ago = naturaltime(time)
    # In the reader's time zone, as the ``date`` filter shows a variable (expects_localtime).
    time = template_localtime(time, use_tz=context.use_tz)
    return format_html(
        '<time datetime="{}" title="{}">{}</time> <span class="abs-time">({})</span>', *_moment(time, ago)
    )


def _moment(time: Any, ago: str) -> tuple[str, str, str, str]:
    """What ``date:"c"``, ``date:"Y-m-d H:i:s T"`` and ``date:"j M Y, H:i T"`` write, built
    directly: Django's ``date`` filter looks the format up as a setting and parses it again on
    every call, which made more than half of this tag's time (a search page writes a hundred
    moments; ``tests/bench/bench_scale.py``). The one difference: in the repeated hour when the
    clocks go back, the filter names no zone ("01:34 "), and this names the one the offset says
    ("01:34 EDT"). A naive moment (no zone of its own) still goes through the filter, which names
    the default zone."""
    if not isinstance(time, datetime) or time.tzinfo is None:
        return (date_format(time, "c"), date_format(time, "Y-m-d H:i:s T"), ago, date_format(time, "j M Y, H:i T"))
    zone = str(time.tzinfo.tzname(time))
    clock = f"{time.hour:02d}:{time.minute:02d}"
    exact = f"{time.year:04d}-{time.month:02d}-{time.day:02d} {clock}:{time.second:02d} {zone}"
    # MONTHS_3 is translated, as the filter's "M" is ("Déc" in French, "Dez" in German).
    readable = f"{time.day} {MONTHS_3[time.month].title()} {time.year:04d}, {clock} {zone}"
    return time.isoformat(), exact, ago, readable
