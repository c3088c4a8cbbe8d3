"""Append-only trails: rows written once, in the transaction of the change they record, and
never updated or deleted (docs/architecture.md section 8, invariant 9).

Python refuses an update or a delete here, for a row and for a queryset alike; on PostgreSQL a
trigger refuses them too (the trails' migrations)."""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

from django.db import models

_Row = TypeVar("_Row", bound=models.Model)


class TrailIsAppendOnly(Exception):
    """Code tried to update or delete a row of an append-only trail."""


def _refusal(model: type[models.Model], verb: str) -> TrailIsAppendOnly:
    error: type[TrailIsAppendOnly] = getattr(model, "append_only_error", TrailIsAppendOnly)
    return error(f"{getattr(model, 'trail_name', 'trail rows')} cannot be {verb}")


class AppendOnlyQuerySet(models.QuerySet[_Row]):
    def update(self, **kwargs: Any) -> int:
        raise _refusal(self.model, "updated")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise _refusal(self.model, "deleted")


class AppendOnly(models.Model):
    """A row of an append-only trail. ``trail_name`` names the rows in the refusal, and
    ``append_only_error`` is the trail's own error (a kind of TrailIsAppendOnly)."""

    trail_name: ClassVar[str] = "trail rows"
    append_only_error: ClassVar[type[TrailIsAppendOnly]] = TrailIsAppendOnly

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise _refusal(type(self), "updated")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise _refusal(type(self), "deleted")
