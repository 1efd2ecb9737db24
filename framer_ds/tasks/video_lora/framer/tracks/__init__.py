"""Framer's point tracks: per-video tracks (analytic or CoTracker), their heatmaps per clip, `data.tracks`
and `framer-ds data tracks`, and the `--tracks` file of `framer-ds sample`."""
