"""The audit trail's evidence: signed checkpoints, the check of every chain, bundles per action
(docs/evidence.md)."""
