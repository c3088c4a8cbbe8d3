"""What every layer above stands on: the refusal every service raises, the database's guards,
publishing tasks on commit, the security trail, separation of duties, safe text, owner picking
and outbound calls to addresses a user chose."""

from __future__ import annotations
