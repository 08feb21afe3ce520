"""Seeded model checkpoints (and DFlash drafts) for the GPU runs, and their parity policies."""
