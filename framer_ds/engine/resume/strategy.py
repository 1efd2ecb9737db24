"""Whether a checkpoint can load under the strategy that runs now, and from which directory.

DDP / single-process checkpoints (model.safetensors + optimizer.bin) hold full, unsharded state and load
at any world size as they are; FSDP2's torch.distributed.checkpoint shards load at any world size too,
but only under FSDP2. A DeepSpeed ZeRO checkpoint loads only under DeepSpeed, only into the same
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
from framer_ds.engine.fsdp2 import uses_fsdp2
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


FSDP2_MODEL_DIR = "pytorch_model_fsdp_0"  # accelerate's torch.distributed.checkpoint dir of the model


def check_same_sharding(checkpoint: Path, running: str) -> None:
    """Refuse, in one line, an FSDP2 checkpoint under another strategy and any other one under FSDP2.

    An FSDP2 checkpoint holds torch.distributed.checkpoint shards (`pytorch_model_fsdp_0/`,
    `optimizer_0/`): they reload under FSDP2 at any number of processes (the shards are re-cut on load),
    but DDP and DeepSpeed look for their own files and fail deep in `load_state`; a DDP or ZeRO
    checkpoint has no shards for FSDP2 to read. `running` names the strategy of this launch."""
    written_fsdp2 = (Path(checkpoint) / FSDP2_MODEL_DIR).is_dir()
    if written_fsdp2 == (running == "FSDP2"):
        return
    if written_fsdp2:
        raise RunSetupError(
            f"{checkpoint} was written under FSDP2 (torch.distributed.checkpoint shards) but this run uses "
            f"{running}: resume with `accelerate launch --config_file configs/accelerate_fsdp2_4gpu.yaml` "
            "(or accelerate_fsdp2_cpu_2proc.yaml; any number of processes: the shards are re-cut on load), "
            "or take its weights into a new run: `python -m torch.distributed.checkpoint.format_utils "
            f"dcp_to_torch {checkpoint}/{FSDP2_MODEL_DIR} model.pt` (or use the run's final/)"
        )
    raise RunSetupError(
        f"{checkpoint} was written without FSDP2 (DDP or DeepSpeed files, no {FSDP2_MODEL_DIR}/) but this "
        "run uses FSDP2: resume with the launch that wrote it (its ZeRO checkpoint loads at another number "
        "of processes through `framer-ds checkpoint universal`), or start a new FSDP2 run from its weights "
        "(the run's final/, or zero_to_fp32.py in a ZeRO checkpoint)"
    )


def running_strategy(accelerator: Accelerator) -> str:
    """This launch's strategy in the words `check_same_sharding` uses."""
    if uses_fsdp2(accelerator):
        return "FSDP2"
    return "DeepSpeed" if uses_deepspeed(accelerator) else "DDP"


def directory_to_load(accelerator: Accelerator, checkpoint: Path) -> Path:
    """The directory to `load_state` from: `checkpoint` itself, or its universal conversion when it is a
    ZeRO checkpoint written at another world size (converted once on the main process, then reused).

    Call on EVERY rank, before `accelerator.prepare` (it may set the engine's `load_universal` flag).
    """
    checkpoint = Path(checkpoint)
    check_same_sharding(checkpoint, running_strategy(accelerator))
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
