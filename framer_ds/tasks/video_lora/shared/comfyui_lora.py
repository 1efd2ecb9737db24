"""What every base's `framer-ds export --format comfyui` shares: peft's LoRA scale, the adapters no plain
ComfyUI LoRA file can carry, and the writer of the one file.

Each family maps its own module names (svd/comfyui_keys.py, wan/lora_layout.py, ltx2/lora.py) and hands
that map to `export_comfyui_lora`, which reads the adapter, refuses what a plain file cannot carry, and
writes; the file goes out, through `engine.export_out.export_file`: added beside the files already in --out (a
ComfyUI `models/loras` folder holds the user's other LoRAs), a file of the same name replaced only with
--overwrite, the matrices in --dtype, the adapter's metadata in the safetensors header.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.engine.export_out import export_file
from framer_ds.tasks.video_lora.shared.exports import EXPORT_METADATA


def lora_scale(rank: int, adapter_config: Mapping[str, Any] | None) -> float:
    """peft's LoRA scale for this adapter: alpha / r, alpha / sqrt(r) with rsLoRA, 1.0 without a config."""
    if adapter_config is None:
        return 1.0
    alpha = float(adapter_config.get("lora_alpha", rank))
    return alpha / math.sqrt(rank) if adapter_config.get("use_rslora") else alpha / rank


def refusal(reason: str) -> ConfigError:
    """The one line a comfyui export that cannot be written ends with."""
    return ConfigError([ConfigProblem("--format", f"comfyui cannot load this adapter: {reason}")], "export")


def refuse_unsupported_adapter(adapter_config: Mapping[str, Any]) -> None:
    """A LoRA file holds per module two matrices and at most one scale: an adapter whose delta is not
    `lora_scale * B @ A` with one scale for all (DoRA's magnitude vector, per-module rank or alpha, an
    init that moved the base weights) would load in ComfyUI as a silently different delta."""
    if adapter_config.get("use_dora"):
        raise refusal("it is a DoRA adapter (a magnitude vector ComfyUI's plain LoRA format has no key for)")
    if adapter_config.get("rank_pattern") or adapter_config.get("alpha_pattern"):
        raise refusal("per-module rank_pattern/alpha_pattern are not supported by this exporter")
    init = adapter_config.get("init_lora_weights")
    if isinstance(init, str) and init.lower().startswith(("pissa", "olora")):
        raise refusal(f"init {init!r} changes the base weights, so the LoRA alone is not a delta on the base")


def write_comfyui_lora(
    options: Any, name: str, tensors: Mapping[str, torch.Tensor], record: Mapping[str, Any]
) -> Path:
    """`tensors` as `--out/name` (options: VideoExportCommandOptions), the matrices in `--dtype` (an
    `.alpha` stays float32: ComfyUI reads it as a number), `record` (the adapter's metadata) in the
    header, since a single-file export adds nothing else to a loader's folder. Returns the file's path."""
    dtype = getattr(torch, options.dtype)
    cast = {k: v if k.endswith(".alpha") else v.to(dtype).contiguous() for k, v in tensors.items()}
    header = {
        "format": "pt",
        "framer_ds": "video_lora",
        EXPORT_METADATA: json.dumps({**record, "format": "comfyui"}),
    }
    with export_file(options.out, name, options.overwrite) as path:
        save_file(cast, str(path), metadata=header)
    return Path(options.out) / name


Converter = Callable[[dict[str, torch.Tensor], dict[str, Any]], dict[str, torch.Tensor]]
"""A family's key map: (peft's adapter tensors, its adapter_config.json) -> the ComfyUI file's tensors."""


def export_comfyui_lora(
    export_dir: Path, metadata: Mapping[str, Any], options: Any, name: str, convert: Converter
) -> tuple[Path, dict[str, torch.Tensor]]:
    """Every family's `--format comfyui`: the adapter in `export_dir` (its metadata read by the family,
    which checks it first) refused where no plain LoRA file can carry it, mapped by the family's
    `convert`, written as `--out/name` (`write_comfyui_lora`). Returns the file's path and what it holds."""
    export_dir = Path(export_dir)
    adapter_config = json.loads((export_dir / "adapter_config.json").read_text())
    refuse_unsupported_adapter(adapter_config)
    tensors = convert(load_file(str(export_dir / "adapter_model.safetensors")), adapter_config)
    return write_comfyui_lora(options, name, tensors, metadata), tensors
