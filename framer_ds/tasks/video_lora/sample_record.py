"""What `framer-ds sample` conditions on, decided once, printed and stored beside the video.

Why: a sample is only reproducible (and comparable with another) when its seed and every conditioning
value are known; they come from three places (the flags, the export's metadata, and with
`--motion-bucket auto` the input frames), so they are resolved here into one record that is printed
before the denoising starts and written as `<out stem>.json` beside the mp4 (atomically).

The motion bucket of a run trained with `model.motion_bucket: from_data` is, by default, estimated from
the given first and last frames with the measure training used (`data/motion_score.py`: the pair's
normal-flow score per clip frame, mapped by the training set's recorded score quantiles), instead of
the fixed 127 that made every sample move like an average training clip.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.storage.atomic import atomic_write_json
from framer_ds.tasks.video_lora.data.motion_score import bucket_from_quantiles, end_frames_score

AUTO = "auto"


def motion_bucket_choice(
    flag: int | str | None,
    metadata: dict[str, Any],
    first: torch.Tensor,
    last: torch.Tensor | None,
    num_frames: int,
) -> dict[str, Any]:
    """{"motion_bucket": N, "motion_bucket_source": why, ["motion_score": s]}: an explicit number wins;
    `auto` (the default for a from_data export) estimates it from the input frames; otherwise the
    export's trained bucket."""
    from_data = "motion_score_quantiles" in metadata
    if isinstance(flag, int):
        return {"motion_bucket": flag, "motion_bucket_source": "--motion-bucket"}
    if flag == AUTO and not from_data:
        problem = ConfigProblem(
            "--motion-bucket",
            f"auto estimates the bucket with the motion score quantiles of a run trained with "
            f"model.motion_bucket: from_data; this export trained at the fixed bucket "
            f"{metadata.get('motion_bucket_id')}: pass a number 0..255 or leave the flag out",
        )
        raise ConfigError([problem], "sample")
    if not from_data:
        return {"motion_bucket": int(metadata["motion_bucket_id"]), "motion_bucket_source": "the export"}
    # image-to-video has no last frame: the first alone shows no motion, as a still clip would
    score = end_frames_score(first, last if last is not None else first, num_frames)
    return {
        "motion_bucket": bucket_from_quantiles(score, metadata["motion_score_quantiles"]),
        "motion_bucket_source": "the input frames",
        "motion_score": score,
    }


def sample_record(
    adapter_dir: Path, metadata: dict[str, Any], options: Any, settings: dict[str, Any]
) -> dict[str, Any]:
    """Everything the sample depends on: the export, the inputs, the seed and each conditioning value
    (`settings`: the resolved shape, fps, motion bucket, device and dtype)."""
    record = {
        "export": str(Path(adapter_dir).resolve()),
        "base": metadata.get("base", "svd"),
        "base_model": metadata.get("base_model"),
        **({"framer_path": metadata.get("framer_path")} if metadata.get("base") == "framer" else {}),
        "mode": metadata["mode"],
        "image": str(options.image),
        "last_image": str(options.last_image) if options.last_image is not None else None,
        "resize": options.resize,
        "seed": options.seed,
        **settings,
        "noise_aug_strength": options.noise_aug,
        "steps": options.steps,
        "min_guidance": options.min_guidance,
        "max_guidance": options.max_guidance,
        "guidance_schedule": options.guidance_schedule,
        "decode_chunk_size": options.decode_chunk_size,
    }
    if metadata.get("base") == "framer":
        record["tracks"] = str(options.tracks) if options.tracks is not None else None
    return record


def describe(record: dict[str, Any]) -> str:
    """The lines printed before sampling: the motion bucket (and where it came from), then the rest."""
    lines = []
    if record["motion_bucket_source"] == "the input frames":
        lines.append(f"motion bucket {record['motion_bucket']} (from the input frames)")
    shown = {k: v for k, v in record.items() if v is not None and k not in ("export", "image", "last_image")}
    lines.append("sampling " + ", ".join(f"{k}={v}" for k, v in shown.items()))
    return "\n".join(lines)


def record_path(video: Path) -> Path:
    """`clip.mp4` -> `clip.json` beside it (next to `clip_frames/`)."""
    return Path(video).with_suffix(".json")


def write_sample_record(video: Path, record: dict[str, Any]) -> Path:
    path = record_path(video)
    atomic_write_json(path, record)
    return path
