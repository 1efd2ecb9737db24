"""What `framer-ds sample` conditions on, decided once, printed and stored beside the video, and the
one writer of a sample's files for every base family.

Why: a sample is only reproducible (and comparable with another) when its seed and every conditioning
value are known; they come from the flags, the export's metadata and (SVD's `--motion-bucket auto`)
the input frames, so each family resolves them into one record that is printed before the denoising
starts and written as `<out stem>.json` beside the mp4 (atomically), with the frames as PNGs in
`<out stem>_frames/` (`write_sample_outputs`, the same files for SVD, Framer and Wan).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from framer_ds.storage.atomic import atomic_write_json
from framer_ds.tasks.video_lora.shared.data import video_write


def sample_record(
    adapter_dir: Path,
    metadata: dict[str, Any],
    options: Any,
    settings: dict[str, Any],
    base_fields: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything the sample depends on: the export (and `base_fields`, the family's own folders), the
    inputs, the seed and each conditioning value (`settings`: the family's resolved shape, fps, guidance,
    device and dtype...)."""
    return {
        "export": str(Path(adapter_dir).resolve()),
        "base": metadata.get("base", "svd"),
        "base_model": metadata.get("base_model"),
        **(base_fields or {}),
        "mode": metadata["mode"],
        "image": str(options.image),
        "last_image": str(options.last_image) if options.last_image is not None else None,
        "resize": options.resize,
        "seed": options.seed,
        **settings,
    }


def describe(record: dict[str, Any]) -> str:
    """The lines printed before sampling: the motion bucket (and where it came from), then the rest."""
    lines = []
    if record.get("motion_bucket_source") == "the input frames":
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


@dataclass(frozen=True)
class WrittenSample:
    """What `write_sample_outputs` wrote."""

    video: Path
    codec: str
    frames: Path | None  # <stem>_frames/, None with --no-frames
    record: Path  # <stem>.json

    @property
    def codec_name(self) -> str:
        return "H.264" if self.codec == video_write.H264 else self.codec

    def files_note(self) -> str:
        """ "; the frames as PNGs in X; settings in Y": the end of the line `framer-ds sample` prints."""
        frames = f"; the frames as PNGs in {self.frames}" if self.frames is not None else ""
        return f"{frames}; settings in {self.record}"


def write_sample_outputs(
    out: Path, pixels: np.ndarray, fps: float, record: dict[str, Any], frames: bool
) -> WrittenSample:
    """`framer-ds sample`'s files, whatever the base family: the mp4 at `fps`, with `frames` each frame
    as a PNG in `<stem>_frames/` (lossless, to compare frame by frame), and `<stem>.json`, the record
    with the video and its codec. `pixels`: uint8 [T, H, W, 3]."""
    codec = video_write.write_video(out, pixels, fps)  # through the module: tests stand in for the writer
    folder = video_write.write_frame_pngs(out, pixels) if frames else None
    path = write_sample_record(out, {**record, "video": str(out), "codec": codec})
    return WrittenSample(Path(out), codec, folder, path)
