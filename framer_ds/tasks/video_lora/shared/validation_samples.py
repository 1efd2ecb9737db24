"""Sample videos from held-out frames during training, spread over every rank.

Why every rank: under ZeRO-3 each UNet forward gathers parameter shards from all ranks, so a rank
that skipped sampling would leave the others waiting forever. Each rank takes every world_size-th
input; ranks short of an input repeat a dummy one so every rank runs the same number of forwards.
Frames travel to the main process as uint8 (no shared filesystem assumed), which writes the mp4s.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from torch import Tensor
from torch.utils.data import Dataset

from framer_ds.data.item_draws import drawn_at_epoch
from framer_ds.data.progress import sampling_progress
from framer_ds.tasks.video_lora.shared.data.video_index import VIDEO_EXTENSIONS
from framer_ds.tasks.video_lora.shared.data.video_write import to_uint8_frames, write_frame_pngs, write_video
from framer_ds.tasks.video_lora.shared.options import SampleOptions
from framer_ds.tasks.video_lora.shared.protocol import ClipToSample, FamilySampler
from framer_ds.tasks.video_lora.shared.sample_record import write_sample_record


@dataclass
class SampleInput:
    name: str
    first: Tensor  # [3,H,W] in [-1,1]
    last: Tensor | None  # interpolation
    reference: Tensor | None  # [T,3,H,W] the real clip, shown beside the sample
    fps: float
    motion_bucket: int | None = None  # the clip's own bucket (model.motion_bucket from_data)
    controlnet_cond: Tensor | None = None  # [F,3,H,W] the clip's point heatmaps (data.tracks, Framer)
    prompt_emb: Tensor | None = None  # [L,D] the clip's UMT5 states from the latent cache (Wan)


def _cached_prompt(cached: Dataset | None, index: int, video_id: str) -> Tensor | None:
    """Entry `index`'s prompt states when it is this clip's (cache entry i is item i of its split, the
    training split's copy 0 drawn as epoch 0 draws it); None without a cache or prompt states."""
    if cached is None or index >= len(cached):
        return None
    entry = cached[index]
    return entry.get("prompt_emb") if entry.get("video_id") == video_id else None


def collect_sample_inputs(
    source: Dataset,
    options: SampleOptions,
    interpolation: bool,
    with_reference: bool,
    fps: float | None,
    cached: Dataset | None = None,
) -> list[SampleInput]:
    """The first `options.count` items of a pixel dataset (held-out clips, or training clips with
    their augmentation drawn as in epoch 0, so every round samples the same inputs), each with its
    own motion bucket and point heatmaps when the items carry them (`motion_bucket: from_data`,
    `data.tracks`), as interp_eval uses them. `cached`: the same split's latent cache, whose prompt
    states a Wan sampler takes instead of loading UMT5."""
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
                    prompt_emb=_cached_prompt(cached, index, item["video_id"]),
                )
            )
    return inputs


def _file_name(index: int, name: str) -> str:
    stem = str(Path(name).with_suffix("")) if Path(name).suffix.lower() in VIDEO_EXTENSIONS else name
    return f"{index:02d}_{re.sub(r'[^A-Za-z0-9._-]+', '_', stem)[:80]}.mp4"


def _clip(source: SampleInput, num_frames: int, device: torch.device | str) -> ClipToSample:
    """An input as the family's sampler takes it, on the device (heatmaps [F,3,H,W] -> [1,F,3,H,W])."""
    heatmaps = source.controlnet_cond
    return ClipToSample(
        video_id=source.name,
        first=source.first.to(device),
        last=source.last.to(device) if source.last is not None else None,
        num_frames=num_frames,
        fps=source.fps,
        motion_bucket=source.motion_bucket,
        controlnet_cond=heatmaps[None].to(device) if heatmaps is not None else None,
        prompt_emb=source.prompt_emb,
    )


def write_sample_round(
    accelerator: Accelerator,
    sampler: FamilySampler,
    inputs: list[SampleInput],
    options: SampleOptions,
    num_frames: int,
    out_dir: Path,
) -> list[Path]:
    """Every rank calls this; returns the written videos on the main process (empty elsewhere).
    `sampler`: the base family's (`VideoBaseFamily.training_sampler`); input i is sampled with seed
    `options.seed + i`. Every input of one dataset has heatmaps (Framer's ControlNet) or none does, so
    under ZeRO-3 every rank runs the same forwards."""
    world, rank, device = accelerator.num_processes, accelerator.process_index, accelerator.device
    produced: list[tuple[int, np.ndarray, dict]] = []
    rounds = math.ceil(len(inputs) / world)
    with sampling_progress(rounds * sampler.steps(options), "samples", accelerator.is_main_process) as bar:
        for round_index in range(rounds):
            index = round_index * world + rank
            clip = _clip(inputs[min(index, len(inputs) - 1)], num_frames, device)  # the dummy: the last
            generator = torch.Generator(device=device).manual_seed(options.seed + index)
            frames = sampler.sample(clip, options, generator, on_step=bar.update)
            if index < len(inputs):
                record = {"input": clip.video_id, "seed": options.seed + index, "num_frames": num_frames}
                produced.append((index, to_uint8_frames(frames), {**record, **sampler.record(clip, options)}))
    gathered = gather_object(produced)  # the list itself in a single process
    if not accelerator.is_main_process:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for index, pixels, record in sorted(gathered, key=lambda item: item[0]):
        source = inputs[index]
        if options.with_reference and source.reference is not None:
            pixels = np.concatenate([to_uint8_frames(source.reference), pixels], axis=2)  # side by side
        path = out_dir / _file_name(index, source.name)
        write_video(path, pixels, source.fps)
        write_frame_pngs(path, pixels)  # <name>_frames/frame_000.png ...: to compare frame by frame
        write_sample_record(path, record)  # <name>.json: what it conditioned on, as `framer-ds sample`'s
        written.append(path)
    return written
