"""The kinds registry: a kind's name maps to the object that knows everything about it.

Shaped like healthchecks' transport map: the engine asks ``kind_for(action.kind)`` and never
branches on a name. A new kind is one package under ``actions.kinds`` and one ``register``
line in ``actions.kinds``, which registers the shipped ones; tests may register their own.
"""

from __future__ import annotations

from actions.foundation.owners import owner_group_name, owner_group_names
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


def owner_group_of(name: str) -> str:
    """The group that owns review items of the kind ``name``: the admin's mapping (OwnerGroup)
    where there is one, else the group the kind declares. The five-checks page names it,
    escalations go to its members, and only they (or a person given an item) resolve."""
    return owner_group_name(name, kind_for(name).owner_group)


def owner_groups() -> dict[str, str]:
    """``owner_group_of`` for every registered kind, read in one query: for a page that asks
    about many items."""
    return owner_group_names({kind.name: kind.owner_group for kind in _KINDS.values()})


def all_kinds() -> list[EffectKind]:
    return sorted(_KINDS.values(), key=lambda kind: kind.name)
