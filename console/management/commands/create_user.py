"""Create a console user with roles, for set-up scripts.

    manage.py create_user maria --role manager --limit EUR:500 --password-env MARIA_PASSWORD
    manage.py create_user otto --role agent          # an agent's owner; no password, no log-in
    manage.py create_user fiona --role finance --password-file /run/secrets/fiona

The password is read from a file or an environment variable, never from the command line
(where ``ps`` and shell history would show it).
"""

from __future__ import annotations

import os
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.roles import ROLES
from console.users import UserInvalid, user_create_or_update


class Command(BaseCommand):
    help = "Create a user with one or more roles (agent, manager, finance, admin)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="The username.")
        parser.add_argument("--role", action="append", required=True, choices=ROLES, help="Repeat for several roles.")
        parser.add_argument("--email", default="")
        parser.add_argument(
            "--limit",
            action="append",
            default=[],
            metavar="CUR:AMOUNT",
            help="A manager's approval limit, e.g. EUR:500 (repeat per currency).",
        )
        secret = parser.add_mutually_exclusive_group()
        secret.add_argument("--password-file", help="Read the password from the first line of this file.")
        secret.add_argument("--password-env", metavar="VAR", help="Read the password from this environment variable.")
        parser.add_argument("--update", action="store_true", help="The user exists: add the roles and limits.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            result = user_create_or_update(
                username=options["name"],
                roles=options["role"],
                password=self._password(options),
                email=options["email"],
                limits=self._limits(options["limit"]),
                update=options["update"],
            )
        except UserInvalid as invalid:
            raise CommandError(str(invalid)) from None
        verb = "Created" if result.created else "Updated"
        roles = ", ".join(sorted(result.user.groups.values_list("name", flat=True)))
        login = "" if result.user.has_usable_password() else " It has no password: set one with changepassword."
        self.stdout.write(f"{verb} user {result.user.username!r} with roles {roles}.{login}")

    def _password(self, options: dict[str, Any]) -> str | None:
        if options["password_file"]:
            try:
                lines = Path(options["password_file"]).read_text().splitlines()
            except OSError as exc:
                raise CommandError(f"Cannot read the password file: {exc.strerror}.") from None
            if not lines or not lines[0]:
                raise CommandError("The password file is empty.")
            return lines[0]
        if options["password_env"]:
            value = os.environ.get(options["password_env"])
            if not value:
                raise CommandError(f"The environment variable {options['password_env']} is not set or empty.")
            return value
        return None

    def _limits(self, raw: list[str]) -> dict[str, Decimal]:
        limits = {}
        for item in raw:
            currency, _, amount = item.partition(":")
            try:
                limits[currency.strip().upper()] = Decimal(amount.strip())
            except InvalidOperation:
                raise CommandError(f"--limit takes CUR:AMOUNT, e.g. EUR:500 (not {item!r}).") from None
        return limits
