"""``{% money %}`` and ``{% age %}``: how every page shows an amount and a moment. They replaced two
``{% include %}`` templates (P-e) and must write what those wrote."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.template import engines
from django.utils import timezone, translation


def render(source: str, **context: Any) -> str:
    return engines["django"].from_string(source).render(context)


@pytest.mark.parametrize(
    ("amount", "currency", "shown"),
    [
        (Decimal("1250.5"), "EUR", '<span class="money">1,250.50 EUR</span>'),
        (Decimal("0"), "EUR", '<span class="money">0.00 EUR</span>'),
        # Yen and the other zero-decimal currencies have no minor unit to show.
        (Decimal("125000"), "JPY", '<span class="money">125,000 JPY</span>'),
        (Decimal("-3.456"), "USD", '<span class="money">-3.46 USD</span>'),
    ],
)
def test_an_amount_is_shown_in_its_currencys_decimals_grouped(amount: Decimal, currency: str, shown: str) -> None:
    with translation.override("en"):
        assert render("{% money amount currency %}", amount=amount, currency=currency) == shown


def test_a_currency_is_escaped_like_any_other_text() -> None:
    assert render("{% money 1 currency %}", currency="<b>") == '<span class="money">1.00 &lt;b&gt;</span>'


def test_a_moment_is_shown_relative_with_the_exact_time_in_the_readers_zone() -> None:
    moment = datetime(2026, 12, 4, 9, 43, 5, tzinfo=UTC)
    with translation.override("en"), timezone.override("Asia/Tokyo"):
        shown = render("{% age moment %}", moment=moment)
    assert shown.startswith('<time datetime="2026-12-04T18:43:05+09:00" title="2026-12-04 18:43:05 JST">')
    assert shown.endswith('</time> <span class="abs-time">(4 Dec 2026, 18:43 JST)</span>')


def test_a_recent_moment_reads_as_how_long_ago() -> None:
    with translation.override("en"):
        shown = render("{% age moment %}", moment=timezone.now() - timedelta(minutes=3))
    assert ">3\xa0minutes ago</time>" in shown


def test_no_moment_is_a_dash_not_the_word_none() -> None:
    assert render("{% age moment %}", moment=None) == '<span class="muted">—</span>'


@pytest.mark.parametrize(("language", "month"), [("en", "Dec"), ("fr", "Déc"), ("de", "Dez")])
def test_the_month_is_named_in_the_readers_language(language: str, month: str) -> None:
    moment = datetime(2026, 12, 4, 9, 43, 5, 120_000, tzinfo=UTC)
    with translation.override(language), timezone.override("Europe/Paris"):
        shown = render("{% age moment %}", moment=moment)
    assert '<time datetime="2026-12-04T10:43:05.120000+01:00" title="2026-12-04 10:43:05 CET">' in shown
    assert shown.endswith(f'<span class="abs-time">(4 {month} 2026, 10:43 CET)</span>')


def test_the_repeated_hour_when_the_clocks_go_back_names_its_zone() -> None:
    """01:34 happens twice in New York on 7 November 2010; the offset and the zone's name say
    which (Django's ``date`` filter leaves the name out in that hour)."""
    first, second = datetime(2010, 11, 7, 5, 34, tzinfo=UTC), datetime(2010, 11, 7, 6, 34, tzinfo=UTC)
    with translation.override("en"), timezone.override("America/New_York"):
        shown = [render("{% age moment %}", moment=moment) for moment in (first, second)]
    assert 'datetime="2010-11-07T01:34:00-04:00" title="2010-11-07 01:34:00 EDT"' in shown[0]
    assert shown[0].endswith("(7 Nov 2010, 01:34 EDT)</span>")
    assert 'datetime="2010-11-07T01:34:00-05:00" title="2010-11-07 01:34:00 EST"' in shown[1]
    assert shown[1].endswith("(7 Nov 2010, 01:34 EST)</span>")


def test_a_naive_moment_is_shown_in_the_default_zone() -> None:
    with translation.override("en"), timezone.override("Asia/Tokyo"):
        shown = render("{% age moment %}", moment=datetime(2026, 12, 4, 9, 43, 5))
    assert shown.endswith('<span class="abs-time">(4 Dec 2026, 09:43 UTC)</span>')
