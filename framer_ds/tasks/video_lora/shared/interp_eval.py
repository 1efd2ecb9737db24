"""Held-out interpolation metrics inside the eval loop (`model.interp_eval`).

Each held-out clip of an eval batch is sampled on its own from its first (and last) frame, with a
generator seeded from the clip's id, so its sample is the same whatever the rank count, the batch it
lands in and the step; the metrics are per clip (`shared/interp_metrics.py`) and the loop sums them
over the eval set and the ranks. Under ZeRO-3 every UNet forward is a collective: the loop's eval
loader gives every rank the same number of equally sized batches (accelerate's even_batches repeats
samples to fill the last one; `gather_for_metrics` drops them), so every rank runs the same number of
sampling forwards.

With `data.cache.enabled` the eval loader reads cached latents, which hold no pixels: `with_eval_pixels`
adds each held-out clip's real frames (read again from the video, deterministically: the eval split
has no augmentation) to its cached entry, so the same loader, batches and collectives drive both
eval/loss and these metrics, and the metrics are those of a run without the cache. A Framer base
samples through Framer's conditioning (`FramerFamily.sampling`), with the clip's point heatmaps when
`data.tracks` gives the eval items `controlnet_cond` (else the ControlNet is skipped, as Framer's
pipeline does without points).
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from framer_ds.config.errors import ConfigProblem
from framer_ds.tasks.video_lora.shared.interp_metrics import interpolation_metrics
from framer_ds.tasks.video_lora.shared.options import InterpEvalOptions
from framer_ds.tasks.video_lora.shared.protocol import ClipToSample, FamilySampler

CLIP_CHUNK = 16  # frames per CLIP (and LPIPS) forward


def interp_eval_problems(config: Any) -> list[ConfigProblem]:
    """What `model.interp_eval.enabled` needs: clips with real middle frames, LPIPS files that exist."""
    model, data = config.model, config.data
    if not model.interp_eval.enabled:
        return []
    key, problems = "model.interp_eval.enabled", []
    if data.layout == "image_pairs":
        problems.append(ConfigProblem(key, "image pairs have no real middle frames to compare with"))
    if data.num_frames < 3:
        problems.append(ConfigProblem(key, "needs data.num_frames >= 3 (first, middle, last)"))
    for name in ("lpips_weights", "lpips_backbone"):
        path = getattr(model.interp_eval, name)
        if path is not None and not Path(path).is_file():
            problems.append(
                ConfigProblem(
                    f"model.interp_eval.{name}",
                    f"{path} is not a file; copy it to this machine (nothing is downloaded) or unset "
                    "lpips_weights and lpips_backbone to skip eval/lpips",
                )
            )
    return problems


def lpips_note(options: InterpEvalOptions) -> str:
    """The line a run prints once about eval/lpips (it needs local weight files; nothing is downloaded)."""
    if options.lpips_weights is None:
        return (
            "interp_eval: eval/lpips skipped (no local LPIPS backbone is configured: set "
            "model.interp_eval.lpips_weights and lpips_backbone)"
        )
    return f"interp_eval: eval/lpips from {options.lpips_weights} on {options.lpips_backbone}"


@functools.lru_cache(maxsize=2)
def _lpips_on_cpu(weights: str, backbone: str) -> torch.nn.Module:
    from framer_ds.tasks.video_lora.shared.lpips import load_lpips

    return load_lpips(Path(weights), Path(backbone))


def lpips_distance(
    options: InterpEvalOptions, device: torch.device
) -> Callable[[Tensor, Tensor], Tensor] | None:
    """LPIPS between frame pairs [N,3,H,W] -> [N] in float32 on `device`, or None when not configured.
    The network is loaded once per process (it is small: AlexNet's 2.5M or VGG16's 15M feature weights)."""
    if options.lpips_weights is None or options.lpips_backbone is None:
        return None
    network = _lpips_on_cpu(str(options.lpips_weights), str(options.lpips_backbone)).to(device)

    def distance(x: Tensor, y: Tensor) -> Tensor:
        pairs = zip(x.split(CLIP_CHUNK), y.split(CLIP_CHUNK), strict=True)
        return torch.cat([network(a, b) for a, b in pairs])

    return distance


class EvalPixels(Dataset):
    """Cached eval entries plus the real frames of their clips (`pixel_values`), for interp_eval.

    Eval cache entry i is eval item i (one copy per clip, `VideoLoraTask._cached`), and eval items are
    deterministic (no crop, flip or stride draw), so reading item i again gives the frames the entry
    was encoded from; the video ids are compared to make sure."""

    def __init__(self, cached: Dataset, pixels: Dataset):
        if len(cached) != len(pixels):
            raise ValueError(f"internal: {len(cached)} cached eval entries for {len(pixels)} clips")
        self.cached, self.pixels = cached, pixels

    def __len__(self) -> int:
        return len(self.cached)

    def __getitem__(self, index: int) -> dict[str, Any]:
        entry, item = self.cached[index], self.pixels[index]
        if entry["video_id"] != item["video_id"]:
            raise RuntimeError(
                f"eval cache entry {index} is {entry['video_id']!r} but eval clip {index} is "
                f"{item['video_id']!r}: the cache does not match the data; delete its directory (under "
                "data.cache.dir) and start again, which rebuilds it"
            )
        return {**entry, "pixel_values": item["pixel_values"]}


def with_eval_pixels(cached: Dataset | None, pixels: Dataset | None, config: Any) -> Dataset | None:
    """The cached eval set, with its real frames when `model.interp_eval` needs them."""
    if cached is None or pixels is None or not config.model.interp_eval.enabled:
        return cached
    return EvalPixels(cached, pixels)


def clip_seed(video_id: str, seed: int) -> int:
    """A clip's own sampling seed: the same on every rank and at every evaluation."""
    return (zlib.crc32(str(video_id).encode()) + seed) % (2**63)


@torch.no_grad()
def sample_clips(
    sampler: FamilySampler,
    pixels: Tensor,
    batch: dict[str, Any],
    fps: list[float] | None,
    motion_bucket_ids: list[int | None],
    options: InterpEvalOptions,
    interpolation: bool,
) -> Tensor:
    """[B,T,3,H,W] real clips in [-1,1] -> [B,T,3,H,W] samples from their first (and last) frames,
    each with its own generator, heatmaps (`controlnet_cond`, Framer) and cached prompt states
    (`prompt_emb`, Wan) when the batch has them."""
    device, num_frames, samples = pixels.device, pixels.shape[1], []
    heatmaps, prompts = batch.get("controlnet_cond"), batch.get("prompt_emb")
    for index, video_id in enumerate(batch["video_id"]):
        clip = pixels[index].float()
        generator = torch.Generator(device=device).manual_seed(clip_seed(video_id, options.seed))
        request = ClipToSample(
            video_id=video_id,
            first=clip[0],
            last=clip[-1] if interpolation else None,
            num_frames=num_frames,
            fps=float(fps[index]) if fps is not None else None,
            motion_bucket=motion_bucket_ids[index],
            controlnet_cond=None if heatmaps is None else heatmaps[index : index + 1],
            prompt_emb=None if prompts is None else prompts[index],
        )
        samples.append(sampler.sample(request, options, generator))
    return torch.stack(samples)


def interp_eval_batch(sampler: FamilySampler, batch: dict[str, Any], options: Any) -> dict[str, Tensor]:
    """Per-clip metric values [B] for one eval batch (every rank calls it with its batch): every clip
    sampled from its own first (and last) frame by the base family's sampler and compared with the real
    clip, with its fps and motion bucket as training conditioned on them (`model.fps`,
    `model.motion_bucket`; a cached entry stores the bucket as `motion_bucket`; the LTX-2 sampler reads
    the fps, the Wan sampler neither)."""
    pixels, evaluation = batch["pixel_values"], options.interp_eval
    count = pixels.shape[0]
    fps = batch.get("fps")  # items carry it, SVD's and LTX-2's cache entries too (Wan's need none)
    if options.fps is not None:
        fps = [options.fps] * count
    elif fps is not None:
        fps = fps.float().tolist()
    buckets = batch.get("motion_bucket_id", batch.get("motion_bucket"))
    buckets = [int(b) for b in buckets.tolist()] if buckets is not None else [None] * count
    interpolation = options.base.mode == "interpolation"
    samples = sample_clips(sampler, pixels, batch, fps, buckets, evaluation, interpolation)

    def embed(frames: Tensor) -> Tensor:
        return torch.cat([sampler.embed(c) for c in frames.split(CLIP_CHUNK)])

    perceptual = lpips_distance(evaluation, pixels.device)
    return interpolation_metrics(
        samples, pixels.float(), embed if evaluation.clip_distance else None, perceptual
    )
