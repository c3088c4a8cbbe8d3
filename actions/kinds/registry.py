"""The kinds registry: a kind's name maps to the object that knows everything about it.

Shaped like healthchecks' transport map: the engine asks ``kind_for(action.kind)`` and never
branches on a name. A new kind is one module under ``actions.kinds`` that calls ``register``;
``actions.kinds`` imports the shipped ones, and tests may register their own.
"""

from __future__ import annotations

from actions.kinds.base import EffectKind


class UnknownKind(LookupError):
    pass


_KINDS: dict[str, EffectKind] = {}


def register(kind: EffectKind) -> EffectKind:
    """Add ``kind`` under its name; registering the same name again replaces it (tests)."""
    _KINDS[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    _KINDS.pop(name, None)


def kind_for(name: str) -> EffectKind:
    try:
        return _KINDS[name]
    except KeyError:
        raise UnknownKind(f"no effect kind is registered as {name!r}") from None


def all_kinds() -> list[EffectKind]:
    return sorted(_KINDS.values(), key=lambda kind: kind.name)
