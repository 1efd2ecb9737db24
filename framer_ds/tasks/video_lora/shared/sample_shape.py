"""The frame size and length `framer-ds sample` generates: the trained one by default, or with
`--height/--width` (and `--num-frames`) any shape the export was trained at (data.buckets records each
bucket as `trained_shapes` in the export's metadata; a run without buckets trained one shape).

Why refuse other sizes: a LoRA trained at some shapes has never seen others, and a typo (96 for 960)
would spend minutes sampling a video nobody asked for; the refusal names the shapes that work."""

from __future__ import annotations

from typing import Any

from framer_ds.config.errors import ConfigError, ConfigProblem


def trained_shapes(metadata: dict[str, Any]) -> list[tuple[int, int, int]]:
    """(height, width, num_frames) of every shape the export trained at (exports written before
    buckets existed trained the one configured shape)."""
    listed = metadata.get("trained_shapes") or [
        [metadata["height"], metadata["width"], metadata["num_frames"]]
    ]
    return [(int(h), int(w), int(f)) for h, w, f in listed]


def sample_shape(
    metadata: dict[str, Any], height: int | None, width: int | None, num_frames: int | None
) -> tuple[int, int, int]:
    """(height, width, num_frames) to sample. Without --height/--width: the configured size, and
    --num-frames as given (any length, as before buckets). With them: a trained shape, or ConfigError;
    a missing --num-frames takes the longest trained at that size."""
    if height is None and width is None:
        return metadata["height"], metadata["width"], num_frames or metadata["num_frames"]
    height, width = height or metadata["height"], width or metadata["width"]
    shapes = trained_shapes(metadata)
    lengths = [f for h, w, f in shapes if (h, w) == (height, width)]
    frames = num_frames or (max(lengths) if lengths else metadata["num_frames"])
    if (height, width, frames) not in shapes:
        names = ", ".join(f"{h}x{w}x{f}" for h, w, f in sorted(shapes))
        problem = ConfigProblem(
            "--height/--width/--num-frames",
            f"{height}x{width}x{frames} (HxWxF) is not a shape this export was trained at; trained: {names}",
        )
        raise ConfigError([problem], "sample")
    return height, width, frames
