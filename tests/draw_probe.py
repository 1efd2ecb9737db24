"""Records what each rank of a launched video_lora run draws, for the per-rank stream tests.

A run imports it through `imports=[draw_probe]` (launched ranks find it on PYTHONPATH=tests) and it
appends one JSON line per event to `$FRAMER_TEST_DRAWS_DIR/rank<RANK>.jsonl`:
- `{"init": sha256}` once the model is built, before `accelerator.prepare` (where DDP and DeepSpeed would
  broadcast rank 0's weights and hide a rank that built different ones): a digest of its trainable
  tensors, LoRA init included;
- `{"sigmas": [...], "noise": [...]}` at each training draw of the EDM objective: the sigmas and the
  first values of the noise, recovered as (x_noisy - x0) / sigma.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from framer_ds.tasks.video_lora.svd import edm
from framer_ds.tasks.video_lora.task import VideoLoraTask

NOISE_VALUES = 16


def _record(entry: dict) -> None:
    folder = Path(os.environ["FRAMER_TEST_DRAWS_DIR"])
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"rank{os.environ.get('RANK', '0')}.jsonl", "a") as out:
        out.write(json.dumps(entry) + "\n")


def _digest(model: torch.nn.Module) -> str:
    sha = hashlib.sha256()
    for name, param in model.named_parameters():
        if param.requires_grad:
            sha.update(name.encode())
            sha.update(param.detach().float().contiguous().numpy().tobytes())
    return sha.hexdigest()


_build_model = VideoLoraTask.build_model
_add_noise = edm.add_noise


def _recording_build_model(self) -> torch.nn.Module:
    model = _build_model(self)
    _record({"init": _digest(model)})
    return model


def _recording_add_noise(latents, sigma, generator=None):
    noisy = _add_noise(latents, sigma, generator)
    sigmas = sigma.reshape(-1).float()
    noise = (noisy - latents.float()) / sigmas.view(-1, *([1] * (latents.ndim - 1)))
    _record({"sigmas": sigmas.tolist(), "noise": noise.flatten()[:NOISE_VALUES].tolist()})
    return noisy


VideoLoraTask.build_model = _recording_build_model
edm.add_noise = _recording_add_noise
