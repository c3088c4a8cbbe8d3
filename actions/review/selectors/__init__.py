"""Reads for finance's pages: the review queue, one action's whole story, a follow-up, and the
numbers on the home page.

Every function here runs a fixed number of queries however long the history is: related rows
are joined, the latest attempt of each action is found by a subquery and fetched in one more
query, and the queue's main query only touches the live statuses, which the partial index
``action_live_idx`` covers. ``tests/actions/test_review_scale.py`` holds them to that.
"""

from __future__ import annotations
