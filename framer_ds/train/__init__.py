"""The one training loop shared by every task."""
