"""Each clip's frame rate where the LTX-2 transformer reads one while training.

LTX-2's positions are in seconds: the pipelines divide the time axis of the video RoPE coordinates (and of
a keyframe's) by `frame_rate`, and size the audio as `num_frames / frame_rate` seconds. A clip is taught
at the rate its frames were drawn at, the source fps / the stride (`"fps"` of every video item, stored
in its latent-cache entry), as Lightricks' trainer does (ltx-trainer's process_videos.py stores each
latent's "effective fps = source_fps / subsample factor", its strategy divides the positions by it);
`model.fps` sets one rate for every clip instead (the same key, with the same meaning, as SVD's fps
conditioning).

Per clip where the model allows it: the video and keyframe coordinates are inputs of the transformer
(`video_coords`), so each clip of a micro-batch gets its own. The audio length is one per call (the
audio tokens are a [B, L, C] tensor with no mask), so a run whose clips can differ in rate (videos of
several rates, or `data.stride_range`; decided from the data before training, `possible_rates`) calls
the transformer once per clip (`call_groups`). Why not one call per audio length found in the batch:
the number of calls would then depend on each rank's clips, and under ZeRO-3 or FSDP2 every call
gathers the sharded weights collectively, so ranks making different numbers of calls would hang; one
call per clip is the same count on every rank (training batches are full: drop_last; eval batches are
even across ranks). A run at one rate (or with `model.fps`) makes one call per micro-batch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from framer_ds.tasks.video_lora.ltx2 import conditioning as ltx


def clip_rates(clip_fps: Tensor, fixed: float | None) -> list[float]:
    """The rate each clip trains at: `model.fps` (`fixed`) for all, else its own (source fps / stride)."""
    if fixed is not None:
        return [float(fixed)] * clip_fps.shape[0]
    return [float(rate) for rate in clip_fps.tolist()]


def video_coords(rope: Any, rates: list[float], latent_shape: tuple[int, int, int], device) -> Tensor:
    """[B, 3, F*h*w, 2] RoPE coordinates of each clip at its own rate: diffusers' `prepare_video_coords`
    (which takes one scalar fps) once per distinct rate, so a clip gets the pipeline's numbers exactly."""
    by_rate = {rate: rope.prepare_video_coords(1, *latent_shape, device, fps=rate) for rate in set(rates)}
    return torch.cat([by_rate[rate] for rate in rates])


def keyframe_coords(
    vae_config: dict[str, Any], latent_index: int, latent_shape: tuple[int, int], rates: list[float], device
) -> Tensor:
    """[B, 3, h*w, 2] positions of the last-frame keyframe of each clip at its own rate (the condition
    pipeline's `_prepare_keyframe_coords`, `conditioning.keyframe_coords`)."""
    by_rate = {
        rate: ltx.keyframe_coords(vae_config, latent_index, latent_shape, rate, device) for rate in set(rates)
    }
    return torch.cat([by_rate[rate] for rate in rates])


def audio_latent_frames(audio_vae_config: dict[str, Any], num_frames: int, frame_rate: float) -> int:
    """The pipelines' `audio_num_frames` for a clip of `num_frames` at `frame_rate` (the audio VAE's
    sample rate, hop length and its 4x temporal compression)."""
    from diffusers.models.autoencoders.autoencoder_kl_ltx2_audio import LATENT_DOWNSAMPLE_FACTOR

    per_second = (
        audio_vae_config["sample_rate"] / audio_vae_config["mel_hop_length"] / LATENT_DOWNSAMPLE_FACTOR
    )
    return round(num_frames / frame_rate * per_second)


def possible_rates(records: list[Any], data: Any) -> set[float]:
    """Every rate a clip of `records` can be drawn at (each video's source fps / each configured stride;
    a superset where a short video caps its stride): one value means every micro-batch is at one rate."""
    low, high = data.stride_range or (data.stride, data.stride)
    return {record.source_fps / stride for record in records for stride in range(low, high + 1)}


def call_groups(lengths: list[int], per_clip: bool) -> list[tuple[int, list[int]]]:
    """(audio length, the indices of its clips) of each transformer call of a micro-batch whose clips have
    audio `lengths`: one call per clip where the run's clips can differ in rate (`per_clip`), else one."""
    if per_clip:
        return [(length, [index]) for index, length in enumerate(lengths)]
    if len(set(lengths)) > 1:
        raise RuntimeError(
            f"internal: clips of audio lengths {lengths} in one micro-batch of an LTX-2 run whose data was "
            "noted at one frame rate (Ltx2Family.note_records)"
        )
    return [(lengths[0], list(range(len(lengths))))]
