"""Sample videos from held-out frames during training, spread over every rank.

Why every rank: under ZeRO-3 each UNet forward gathers parameter shards from all ranks, so a rank
that skipped sampling would leave the others waiting forever. Each rank takes every world_size-th
input; ranks short of an input repeat a dummy one so every rank runs the same number of forwards.
Frames travel to the main process as uint8 (no shared filesystem assumed), which writes the mp4s.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from torch import Tensor
from torch.utils.data import Dataset

from framer_ds.data.item_draws import drawn_at_epoch
from framer_ds.data.progress import sampling_progress
from framer_ds.tasks.video_lora.config import SampleOptions
from framer_ds.tasks.video_lora.data.video_index import VIDEO_EXTENSIONS
from framer_ds.tasks.video_lora.data.video_write import to_uint8_frames, write_frame_pngs, write_video
from framer_ds.tasks.video_lora.diffusion.sampling import FramerSampling, SamplerParts, sample_video
from framer_ds.tasks.video_lora.sample_record import write_sample_record


@dataclass
class SampleInput:
    name: str
    first: Tensor  # [3,H,W] in [-1,1]
    last: Tensor | None  # interpolation
    reference: Tensor | None  # [T,3,H,W] the real clip, shown beside the sample
    fps: float
    motion_bucket: int | None = None  # the clip's own bucket (model.motion_bucket from_data)
    controlnet_cond: Tensor | None = None  # [F,3,H,W] the clip's point heatmaps (data.tracks, Framer)


def collect_sample_inputs(
    source: Dataset, options: SampleOptions, interpolation: bool, with_reference: bool, fps: float | None
) -> list[SampleInput]:
    """The first `options.count` items of a pixel dataset (held-out clips, or training clips with
    their augmentation drawn as in epoch 0, so every round samples the same inputs), each with its
    own motion bucket and point heatmaps when the items carry them (`motion_bucket: from_data`,
    `data.tracks`), as interp_eval uses them."""
    inputs = []
    with drawn_at_epoch(source, 0):
        for index in range(min(options.count, len(source))):
            item = source[index]
            pixels, bucket = item["pixel_values"], item.get("motion_bucket_id")
            inputs.append(
                SampleInput(
                    name=item["video_id"],
                    first=pixels[0],
                    last=pixels[-1] if interpolation else None,
                    reference=pixels if with_reference else None,
                    fps=float(fps or item.get("fps") or 7.0),
                    motion_bucket=int(bucket) if bucket is not None else None,
                    controlnet_cond=item.get("controlnet_cond"),
                )
            )
    return inputs


def _with_heatmaps(
    framer: FramerSampling | None, heatmaps: Tensor | None, device: torch.device | str
) -> FramerSampling | None:
    """This input's copy of the run's Framer settings, its ControlNet on the clip's own heatmaps [F,3,H,W]
    (the shared settings stay untouched for the next input)."""
    if framer is None or heatmaps is None:
        return framer
    return replace(framer, controlnet_cond=heatmaps[None].to(device))


def _file_name(index: int, name: str) -> str:
    stem = str(Path(name).with_suffix("")) if Path(name).suffix.lower() in VIDEO_EXTENSIONS else name
    return f"{index:02d}_{re.sub(r'[^A-Za-z0-9._-]+', '_', stem)[:80]}.mp4"


def _record(
    source: SampleInput, index: int, options: SampleOptions, num_frames: int, motion_bucket_id: int
) -> dict:
    """What this validation video conditioned on (`<name>.json` beside it, as `framer-ds sample` writes):
    a clip of a from_data run moves at its own bucket (the clip's motion score, the measure that the
    sampler's `--motion-bucket auto` applies to the given frames), others at the configured one."""
    own = source.motion_bucket is not None
    return {
        "input": source.name,
        "seed": options.seed + index,
        "num_frames": num_frames,
        "fps": source.fps,
        "motion_bucket": source.motion_bucket if own else motion_bucket_id,
        "motion_bucket_source": "the clip's motion score (from_data)" if own else "model.motion_bucket",
        **options.sampling_kwargs(),
    }


def write_sample_round(
    accelerator: Accelerator,
    parts: SamplerParts,
    inputs: list[SampleInput],
    options: SampleOptions,
    num_frames: int,
    motion_bucket_id: int,
    out_dir: Path,
    tile_size: int | None = None,
    framer: FramerSampling | None = None,
) -> list[Path]:
    """Every rank calls this; returns the written videos on the main process (empty elsewhere).
    `motion_bucket_id` conditions the inputs without a bucket of their own. `framer`: a Framer base's
    conventions (`sampling.sample_video`), its ControlNet driven by each input's heatmaps when it has
    them (every input of one dataset has them or none does, so under ZeRO-3 every rank runs the same
    forwards)."""
    world, rank, device = accelerator.num_processes, accelerator.process_index, accelerator.device
    produced: list[tuple[int, np.ndarray]] = []
    rounds = math.ceil(len(inputs) / world)
    with sampling_progress(
        rounds * options.num_inference_steps, "samples", accelerator.is_main_process
    ) as bar:
        for round_index in range(rounds):
            index = round_index * world + rank
            source = inputs[min(index, len(inputs) - 1)]  # the dummy repeats the last input
            generator = torch.Generator(device=device).manual_seed(options.seed + index)
            frames = sample_video(
                parts,
                source.first.to(device),
                source.last.to(device) if source.last is not None else None,
                num_frames,
                source.fps,
                source.motion_bucket if source.motion_bucket is not None else motion_bucket_id,
                generator=generator,
                **options.sampling_kwargs(),
                tile_size=tile_size,
                framer=_with_heatmaps(framer, source.controlnet_cond, device),
                on_step=bar.update,
            )
            if index < len(inputs):
                produced.append((index, to_uint8_frames(frames)))
    gathered = gather_object(produced)  # the list itself in a single process
    if not accelerator.is_main_process:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for index, pixels in sorted(gathered, key=lambda item: item[0]):
        source = inputs[index]
        if options.with_reference and source.reference is not None:
            pixels = np.concatenate([to_uint8_frames(source.reference), pixels], axis=2)  # side by side
        path = out_dir / _file_name(index, source.name)
        write_video(path, pixels, source.fps)
        write_frame_pngs(path, pixels)  # <name>_frames/frame_000.png ...: to compare frame by frame
        write_sample_record(path, _record(source, index, options, num_frames, motion_bucket_id))
        written.append(path)
    return written
