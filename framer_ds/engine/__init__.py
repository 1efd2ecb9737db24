"""Accelerator construction, checkpoints and metric logging."""
