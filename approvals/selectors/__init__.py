"""Reads for the manager's pages: the inbox, one proposal's detail, the dashboard's counts, the
manager's decisions and an action's outcome timeline.

Every function here runs a fixed number of queries however many actions, events or approvals
there are: related rows are joined or prefetched, and the manager's limits are read once and
handed to ``approval_refusal_reason`` row by row. ``tests/approvals/test_query_counts.py``
holds them to that.
"""

from __future__ import annotations
