"""Workflows (sagas): templates, the coordinator, and the proposal and plan-approval services."""
