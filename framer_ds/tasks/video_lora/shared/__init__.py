"""What every video base shares: the data (videos, clips, buckets, latent cache), the family protocol, the
evaluation metrics, the samples written during training and by `framer-ds sample`, and the export helpers.
Imports no base family: a family imports this, never the reverse (pyproject.toml's contract)."""
