"""Adjustment requests record the agent that opened them, as refund requests do: another agent
may then neither read such a request back by its reference nor propose against it. Requests
opened before this migration (and those the matcher or a person opens) have no agent and stay
open to every agent with the scope."""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("actions", "0020_policy_change_kinds"),
    ]

    operations = [
        migrations.AddField(
            model_name="adjustmentrequest",
            name="opened_by_agent",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="adjustment_requests",
                to="actions.agent",
            ),
        ),
    ]
