"""Whether a checkpoint can load under the strategy that runs now, and from which directory.

DDP / single-process checkpoints (model.safetensors + optimizer.bin) hold full, unsharded state and load
at any world size as they are. A DeepSpeed ZeRO checkpoint loads only under DeepSpeed, only into the same
stage layout, and at another world size only through its universal conversion (`universal.py`). Each
mismatch is refused in one line naming the launch that fixes it, before `accelerator.prepare`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from accelerate import Accelerator

from framer_ds.config.errors import ConfigError, ConfigProblem, RunSetupError
from framer_ds.engine.accelerator import uses_deepspeed
from framer_ds.engine.checkpoint import DEEPSPEED_CONFIG
from framer_ds.engine.resume.universal import (
    DS_TAG,
    UNIVERSAL_DIR,
    convert_to_universal,
    enable_universal_loading,
    is_universal,
    zero_shard_count,
)


def checkpoint_zero_stage(checkpoint: Path) -> int | None:
    """The ZeRO stage that wrote `checkpoint`, or None when DeepSpeed did not (DDP, one process).

    Read from the DeepSpeed config `save_checkpoint` records beside the shards (`deepspeed.json`, with
    the offload settings); a checkpoint without it is judged by its files: ZeRO-3 writes one
    `zero_pp_rank_R_mp_rank_00_model_states.pt` per rank, ZeRO-1/2 a single `mp_rank_00_model_states.pt`.
    """
    checkpoint = Path(checkpoint)
    if not zero_shard_count(checkpoint):
        return None
    try:
        return int(json.loads((checkpoint / DEEPSPEED_CONFIG).read_text())["zero_optimization"]["stage"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return 3 if any((checkpoint / DS_TAG).glob("zero_pp_rank_*_model_states.pt")) else 2


def check_same_zero_layout(checkpoint: Path, running_stage: int) -> None:
    """Refuse, in one line, a ZeRO checkpoint whose stage layout differs from the running one.

    ZeRO-1 and ZeRO-2 share one optimizer and one layout (offload on or off does not change it); ZeRO-3
    has its own (per-rank model states, parameter partitions). DeepSpeed fed the other layout fails deep in
    `load_checkpoint` with a bare `AssertionError` (no `zero_pp_rank_*_model_states.pt` for ZeRO-3), and
    its universal conversion does not help: the converted ZeRO-2 checkpoint fails the same way under
    ZeRO-3 (tried with deepspeed 0.19.8), so the fix is the launch that wrote it."""
    written = checkpoint_zero_stage(checkpoint)
    if written is None or (written == 3) == (running_stage == 3):
        return
    shipped = f"configs/deepspeed/zero{written}.json" if written in (2, 3) else "JSON"
    raise RunSetupError(
        f"{checkpoint} was written under ZeRO-{written} but this run uses ZeRO-{running_stage}, and "
        "DeepSpeed cannot load a checkpoint into another ZeRO stage (`framer-ds checkpoint universal` "
        "converts one for another number of processes, not another stage): resume with "
        f"`accelerate launch --deepspeed_config_file {shipped}` (zero_optimization.stage {written}, any "
        f"number of processes), or export its weights with {checkpoint}/zero_to_fp32.py and start a new run"
    )


def directory_to_load(accelerator: Accelerator, checkpoint: Path) -> Path:
    """The directory to `load_state` from: `checkpoint` itself, or its universal conversion when it is a
    ZeRO checkpoint written at another world size (converted once on the main process, then reused).

    Call on EVERY rank, before `accelerator.prepare` (it may set the engine's `load_universal` flag).
    """
    checkpoint = Path(checkpoint)
    shards, universal = zero_shard_count(checkpoint), is_universal(checkpoint)
    if not uses_deepspeed(accelerator):
        if shards or universal:
            raise ConfigError(
                [
                    ConfigProblem(
                        "train.resume",
                        f"{checkpoint} is a DeepSpeed ZeRO checkpoint but this run was launched without "
                        "DeepSpeed; resume with the same `accelerate launch --deepspeed_config_file ...` "
                        f"(any number of processes), or export weights with {checkpoint}/zero_to_fp32.py "
                        "and start a new run from them",
                    )
                ],
                "resume",
            )
        return checkpoint
    if universal:
        enable_universal_loading(accelerator)
        return checkpoint
    if shards == 0:
        raise ConfigError(
            [
                ConfigProblem(
                    "train.resume",
                    f"{checkpoint} was written without DeepSpeed (no {DS_TAG}/*optim_states.pt) but this run "
                    "uses DeepSpeed; resume it with the launch that wrote it (DDP or one process)",
                )
            ],
            "resume",
        )
    check_same_zero_layout(checkpoint, accelerator.state.deepspeed_plugin.zero_stage)
    world = accelerator.num_processes
    if shards == world:
        return checkpoint
    target = checkpoint / UNIVERSAL_DIR
    failure: Exception | None = None
    if accelerator.is_main_process:
        try:
            if is_universal(target):
                note = f"reusing its conversion in {target}"
            else:
                started = time.perf_counter()
                convert_to_universal(checkpoint)
                note = (
                    f"converted it once with DeepSpeed's ds_to_universal into {target} "
                    f"({time.perf_counter() - started:.1f} s)"
                )
            print(
                f"resume: {checkpoint} is a ZeRO checkpoint sharded over {shards} processes but this run "
                f"has {world}; {note}",
                flush=True,
            )
        except Exception as exc:  # re-raised below, after the barrier the other ranks wait at
            failure = exc
    accelerator.wait_for_everyone()
    if failure is not None:
        raise failure
    if not is_universal(target):
        raise RuntimeError(
            f"the main process could not convert {checkpoint} to a universal checkpoint (see its error); "
            f"or convert it by hand: framer-ds checkpoint universal {checkpoint}"
        )
    enable_universal_loading(accelerator)
    return target
