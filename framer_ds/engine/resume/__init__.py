"""Resuming a run from a checkpoint: `ResumePlan` (plan.py) owns the whole story."""

from framer_ds.engine.resume.plan import ResumePlan

__all__ = ["ResumePlan"]
