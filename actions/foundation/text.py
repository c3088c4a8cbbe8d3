"""Free text from agents and people: which characters it may not contain.

Control characters (BEL, ESC, NUL...) and the Unicode bidirectional controls (U+202E RIGHT-TO-
LEFT OVERRIDE and its kin) are refused, not stripped: they let a proposer make the text a
manager reads differ from the text stored ("refund 10" displayed as "01 dnufer"), and quietly
removing them would store something the sender did not send. Line breaks and tabs are allowed.
"""

from __future__ import annotations

import unicodedata

from django.core.exceptions import ValidationError

ALLOWED_CONTROLS = frozenset("\n\r\t")
BIDI_CONTROLS = frozenset(
    "\u061c"  # ARABIC LETTER MARK
    "\u200e\u200f"  # LEFT-TO-RIGHT / RIGHT-TO-LEFT MARK
    "\u202a\u202b\u202c\u202d\u202e"  # embeddings and overrides
    "\u2066\u2067\u2068\u2069"  # isolates
)


def unsafe_characters(text: str) -> list[str]:
    """The refused characters in ``text``, as U+XXXX codes, in order of first appearance."""
    found: list[str] = []
    for char in text:
        refused = char in BIDI_CONTROLS or (unicodedata.category(char) == "Cc" and char not in ALLOWED_CONTROLS)
        code = f"U+{ord(char):04X}"
        if refused and code not in found:
            found.append(code)
    return found


def unsafe_characters_message(codes: list[str]) -> str:
    return (
        f"Remove the control or bidirectional-override characters ({', '.join(codes[:5])}): they can make the text "
        "shown to a person differ from the text stored."
    )


def validate_plain_text(value: str) -> None:
    """A Django form and model validator for free text."""
    codes = unsafe_characters(value or "")
    if codes:
        raise ValidationError(unsafe_characters_message(codes), code="invalid_characters")
