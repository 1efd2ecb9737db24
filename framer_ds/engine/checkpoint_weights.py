"""A checkpoint holds what training changes, not the frozen base it started from.

Why: `accelerator.save_state` writes the whole model state dict. For a LoRA on a 14B Wan transformer
that is ~28 GB of frozen bf16 base weights in every checkpoint (DeepSpeed ZeRO-1/2 writes them twice:
the module states and its "frozen parameter fragments"), beside a LoRA state of a few hundred MB. A
checkpoint written on a stop signal has the seconds Slurm's KillWait or torchrun's shutdown timeout
leave (train/stop_window.py), and keep_last of them fill the disk. The frozen weights are rebuilt from
the base on resume exactly as on the first start (the same config, files and seed build the same
model), so a checkpoint leaves them out: DeepSpeed's own `exclude_frozen_parameters`, and for DDP and
one process a save hook that drops the frozen parameters from the state dict accelerate writes. On
load, those keys and only those may be missing (older checkpoints that hold them still load); any
other difference is refused in one line. FSDP2's sharded state dicts are written whole, as accelerate
writes them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from framer_ds.config.errors import RunSetupError
from framer_ds.engine.accelerator import uses_deepspeed
from framer_ds.engine.fsdp2 import uses_fsdp2

WEIGHT_FILES = ("model{}.safetensors", "pytorch_model{}.bin")  # accelerate's names, "_i" for model i > 0


def frozen_parameter_names(model: torch.nn.Module) -> set[str]:
    """State-dict keys of the parameters that do not train (tied aliases included)."""
    return {name for name, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}


def _drop_frozen(models: list[torch.nn.Module], weights: list[dict[str, Any]], _output_dir: str) -> None:
    """accelerate's save pre-hook: `weights[i]` is the state dict of `models[i]` it is about to write."""
    for model, state in zip(models, weights, strict=False):
        for key in frozen_parameter_names(model) & state.keys():
            del state[key]


def _weights_file(directory: Path, index: int) -> Path:
    suffix = f"_{index}" if index else ""
    found = [directory / name.format(suffix) for name in WEIGHT_FILES]
    return next((path for path in found if path.is_file()), found[0])


def _load_weights(model: torch.nn.Module, path: Path) -> None:
    """Load `path` into `model`, where only frozen parameters may be absent."""
    if path.suffix == ".safetensors":  # safetensors' loader: a tied alias (lm_head = embeddings) is
        from safetensors.torch import load_model  # stored once, and its other names are not "missing"

        missing_keys, unexpected = load_model(model, path, strict=False)
    else:
        result = model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True), strict=False)
        missing_keys, unexpected = result.missing_keys, result.unexpected_keys
    missing = sorted(set(missing_keys) - frozen_parameter_names(model))
    if missing or unexpected:
        shown = ", ".join((missing + sorted(unexpected))[:4])
        raise RunSetupError(
            f"checkpoint {path.parent} does not fit this model: {len(missing)} trained tensor(s) missing, "
            f"{len(unexpected)} unexpected ({shown}). Resume with the config that wrote it "
            f"({path.parent / 'config.yaml'}) or start a new output_dir"
        )


def _load_trainable(models: list[torch.nn.Module], input_dir: str) -> None:
    """accelerate's load pre-hook: load each model here (frozen keys may be absent) and take it off the
    list, so accelerate's strict loader does not see it (its documented way to replace model loading)."""
    for index, model in enumerate(models):
        _load_weights(model, _weights_file(Path(input_dir), index))
    models.clear()


@contextmanager
def trained_state_only(accelerator: Accelerator, loading: bool = False) -> Iterator[dict[str, Any]]:
    """Around `accelerator.save_state(dir, **kwargs)` (or `load_state` with `loading`): yields the
    keyword arguments to pass, with the hook that leaves frozen parameters out registered meanwhile."""
    if uses_deepspeed(accelerator):
        yield {"load_module_strict": False} if loading else {"exclude_frozen_parameters": True}
        return
    if uses_fsdp2(accelerator):  # sharded DCP state dicts, written and read by accelerate as they are
        yield {}
        return
    if loading:
        handle = accelerator.register_load_state_pre_hook(_load_trainable)
    else:
        handle = accelerator.register_save_state_pre_hook(_drop_frozen)
    try:
        yield {}
    finally:
        handle.remove()
