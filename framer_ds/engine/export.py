"""Consolidated weights for `final/` and checkpoints, correct under ZeRO-3 and FSDP2.

Under ZeRO-3 each rank holds a shard of every parameter; a plain `state_dict()` or peft's
`get_peft_model_state_dict` returns (0,)-shaped placeholders and silently writes an EMPTY adapter.
Under FSDP2 each parameter is a DTensor whose local part is 1/N of its rows: copied as it is, an
adapter would be PARTIAL (half the rank dimension on 2 ranks).
Everything here gathers on all ranks (a collective: call on EVERY rank) and writes on rank 0, and
refuses to write a tensor with zero elements.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from safetensors.torch import save_file

from framer_ds import __version__
from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.engine.accelerator import uses_zero3
from framer_ds.engine.fsdp2 import full_tensor, uses_fsdp2
from framer_ds.storage.atomic import atomic_write_json, publish_dir, staging_dir

EXPORT_RECORD = "framer_ds_export.json"
EXPORT_RECORD_FORMAT = 1


class EmptyExportError(RuntimeError):
    """Raised instead of writing weights that hold no data (the ZeRO-3 empty-adapter bug)."""


def gathered_trainable_state_dict(
    accelerator: Accelerator, model: torch.nn.Module
) -> dict[str, torch.Tensor]:
    """Full copies (on CPU) of the trainable parameters, by their names in the unwrapped model.

    Gathers only the trainable tensors (a LoRA adapter, a new input conv), never the frozen base, so
    it stays cheap for a LoRA on a multi-GB UNet. Every rank gets the dict; rank 0 writes it.

    A parameter shared by two modules is listed under both names (each gathered once): with a head tied
    to its input embedding, peft's copies of the two for a LoRA run (`modules_to_save`) share one
    weight, and peft's save looks it up under each module's name (a KeyError before, when writing the
    export of the lora_sft recipe's tied Granite base).
    """
    unwrapped = accelerator.unwrap_model(model)
    named = [(n, p) for n, p in unwrapped.named_parameters(remove_duplicate=False) if p.requires_grad]
    unique = list({id(p): p for _, p in named}.values())
    if uses_zero3(accelerator):
        import deepspeed

        release_prefetched(accelerator, model)
        with deepspeed.zero.GatheredParameters(unique, modifier_rank=None):
            copies = {id(p): p.detach().cpu().clone() for p in unique}
    elif uses_fsdp2(accelerator):  # DTensor shards: all-gather each in the same order on every rank
        copies = {id(p): full_tensor(p.detach()).cpu().clone() for p in unique}
    else:
        copies = {id(p): p.detach().cpu().clone() for p in unique}
    state = {name: copies[id(p)] for name, p in named}
    check_not_empty(state, "trainable parameters")
    return state


def release_prefetched(accelerator: Accelerator, model: torch.nn.Module) -> None:
    """Under ZeRO-3, wait for the parameters DeepSpeed prefetched and release every parameter.

    Why: ZeRO-3 gathers the next modules' parameters ahead of use, asynchronously, and only a backward
    pass (its `reset_step`) settles them. After an eval or sampling forward some parameters can still
    be in flight, and gathering them for a save then dies in DeepSpeed's "Cannot partition a param in
    flight" assertion. Measured: every ZeRO-3 LoRA run at the real SVD size on an H200 (2026-11-26,
    docs/benchmarks.md "GPU suite") failed so at its final export. DeepSpeed's own
    `empty_partition_cache` waits for in-flight gathers and partitions everything. Call on EVERY rank.
    """
    engine = model if hasattr(model, "empty_partition_cache") else None
    if engine is None:
        wrapped = getattr(accelerator, "deepspeed_engine_wrapped", None)
        engine = getattr(wrapped, "engine", None)
    if engine is not None and uses_zero3(accelerator):
        engine.empty_partition_cache()


def check_not_empty(state: dict[str, torch.Tensor], what: str) -> None:
    empty = [name for name, tensor in state.items() if tensor.numel() == 0]
    if not state or empty:
        raise EmptyExportError(
            f"refusing to save {what}: {len(empty)} of {len(state)} tensors have no elements "
            f"(e.g. {empty[:3]}). Under ZeRO-3 parameters must be gathered first; please report this."
        )


def save_pretrained_gathered(accelerator: Accelerator, model: torch.nn.Module, out_dir: Path) -> None:
    """`save_pretrained` of the whole model in safetensors (HF models). Call on EVERY rank.

    Uses accelerate's consolidation, which gathers parameter by parameter onto rank 0 only (under
    ZeRO-3 it needs `stage3_gather_16bit_weights_on_model_save: true`, as the shipped JSONs set).
    """
    release_prefetched(accelerator, model)
    state_dict = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        check_not_empty(state_dict, "the model")
        accelerator.unwrap_model(model).save_pretrained(
            out_dir, state_dict=state_dict, safe_serialization=True
        )
    accelerator.wait_for_everyone()


def save_module_gathered(accelerator: Accelerator, model: torch.nn.Module, path: Path) -> None:
    """A plain (non-HF) module's full state dict as one safetensors file. Call on EVERY rank."""
    release_prefetched(accelerator, model)
    state_dict = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        check_not_empty(state_dict, "the model")
        save_file({k: v.contiguous() for k, v in state_dict.items()}, str(path))
    accelerator.wait_for_everyone()


def save_peft_adapter_gathered(accelerator: Accelerator, model: torch.nn.Module, out_dir: Path) -> None:
    """A peft adapter (adapter_model.safetensors + adapter_config.json), never empty. Every rank."""
    state = gathered_trainable_state_dict(accelerator, model)
    if accelerator.is_main_process:
        accelerator.unwrap_model(model).save_pretrained(out_dir, state_dict=state, safe_serialization=True)
    accelerator.wait_for_everyone()


def publish_export(accelerator: Accelerator, target: Path, write: Callable[[Path], None]) -> None:
    """Write an export directory (`final/`, `best/`) atomically. Call on EVERY rank.

    `write(staging)` runs on every rank (gathering weights under ZeRO-3 is a collective; rank 0 writes
    the files) into a staging directory beside `target`; rank 0 publishes it only after every rank
    finished, replacing an older `target` so that one complete copy exists at every instant."""
    target = Path(target)
    staging = staging_dir(target)
    if accelerator.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    accelerator.wait_for_everyone()
    write(staging)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        publish_dir(staging, target)
    accelerator.wait_for_everyone()


def write_export_record(
    out_dir: Path, task: str, config: dict[str, Any], extra: dict[str, Any] | None = None
) -> None:
    """What an export directory holds: the task that wrote it and the resolved config it ran with
    (+ `extra`, the task's own facts, e.g. the `base_model` an adapter loads into).
    `framer-ds sample DIR` reads it to pick the task; a person reads it to know how a model was made."""
    record = {
        "format": EXPORT_RECORD_FORMAT,
        "task": task,
        "framer_ds_version": __version__,
        **(extra or {}),
        "config": config,
    }
    atomic_write_json(Path(out_dir) / EXPORT_RECORD, record)


def read_export_json(path: Path) -> dict[str, Any]:
    """A JSON record written beside exported weights; a damaged one (cut short by a copy, edited by
    hand) is an error naming the file and the fix, not a traceback."""
    try:
        record = json.loads(Path(path).read_text())
    except ValueError as exc:
        problem = ConfigProblem(
            str(path), f"not valid JSON ({exc}); the export is damaged: copy it again or re-export the run"
        )
        raise ConfigError([problem]) from None
    if not isinstance(record, dict):
        raise ConfigError([ConfigProblem(str(path), "not a JSON object; the export is damaged")])
    return record


def read_export_record(export_dir: Path) -> dict[str, Any]:
    """The record of an export directory; a directory without one gets an error naming what is missing."""
    path = Path(export_dir) / EXPORT_RECORD
    if not Path(export_dir).is_dir():
        problem = "not a directory; pass a run's final/ (or a checkpoint's export, e.g. step_N/adapter/)"
        raise ConfigError([ConfigProblem(str(export_dir), problem)], "export")
    if not path.is_file():
        raise ConfigError(
            [
                ConfigProblem(
                    str(export_dir),
                    f"no {EXPORT_RECORD}, so the task that wrote it is unknown. framer_ds writes it into "
                    "every final/ since version 0.2; a directory from another tool or an older framer_ds "
                    "run cannot be sampled with `framer-ds sample` (retrain, or load the weights with the "
                    "library's own loader, e.g. from_pretrained / PeftModel.from_pretrained).",
                )
            ],
            "export",
        )
    record = read_export_json(path)
    missing = [key for key in ("task", "config") if key not in record]
    if missing:
        raise ConfigError([ConfigProblem(str(path), f"lacks {', '.join(missing)}; the export is damaged")])
    return record
