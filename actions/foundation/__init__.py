"""What every layer above stands on: the audit trail (every state change and its event in one
transaction, the rows written together), the agents' webhook outbox written with it, the named
SQL statements of the dispatch path, the refusal every service raises, the database's guards,
publishing tasks on commit, the security trail, separation of duties, safe text, owner picking
and outbound calls to addresses a user chose."""

from __future__ import annotations
