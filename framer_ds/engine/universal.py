"""Resume at a different world size (2 processes -> 1, 1 -> 2, ...) without the user editing any JSON.

Why this exists:
- A DeepSpeed ZeRO checkpoint holds one optimizer shard per data-parallel rank
  (`pytorch_model/zero_pp_rank_R_mp_rank_00_optim_states.pt`); DeepSpeed refuses to load it at another
  world size ("Automatic adjustment of ZeRO's optimizer state partitioning with a new world size is not
  currently supported"). Its own converter, `deepspeed.checkpoint.ds_to_universal`, rewrites the shards
  as one full fp32/exp_avg/exp_avg_sq tensor per parameter (`zero/<param>/*.pt`), which an engine built
  with `"checkpoint": {"load_universal": true}` slices for ANY world size.
- That flag is read once, when `deepspeed.initialize` parses the config (`DeepSpeedEngine._config`), so it
  must be set in the plugin's config BEFORE `accelerator.prepare`; setting it later has no effect.
- The conversion is written once, atomically, INSIDE the checkpoint (`step_N/universal/`), so keep-last-K
  pruning of `step_N` removes it too and a later resume at yet another world size reuses it. Its layout is
  what `accelerator.load_state` expects: the converted engine files under the tag `pytorch_model` (the tag
  accelerate passes to `engine.load_checkpoint`), next to copies of scheduler.bin, random_states_*.pkl,
  trainer_state.json and latest.
- DDP / single-process checkpoints (model.safetensors + optimizer.bin) hold full, unsharded state and load
  at any world size as they are; only the data position needs adjusting, which
  `adapt_to_world_size` does for every strategy.

`framer-ds checkpoint universal OUTPUT_DIR/checkpoints/step_N` converts ahead of time (e.g. for a
model so large that the conversion would outlast the collective timeout the other ranks wait under).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

from accelerate import Accelerator
from accelerate.checkpointing import load_accelerator_state

from framer_ds.config.errors import ConfigError, ConfigProblem, RunSetupError
from framer_ds.config.schema import TrainConfig
from framer_ds.engine.accelerator import uses_deepspeed
from framer_ds.engine.checkpoint import DEEPSPEED_CONFIG, TrainerState
from framer_ds.storage.atomic import building_dir, publish_dir

DS_TAG = "pytorch_model"  # accelerate's MODEL_NAME: the tag save_state/load_state give the DeepSpeed engine
UNIVERSAL_DIR = "universal"
_LATEST_UNIVERSAL = "latest_universal"  # written by ds_to_universal next to its output folder


def zero_shard_count(checkpoint: Path) -> int:
    """Optimizer shards in a DeepSpeed ZeRO checkpoint = the data-parallel world size that wrote it; 0 if
    `checkpoint` is not one. Counted from the files (not trainer_state.json) because that is what
    DeepSpeed itself checks, and checkpoints from before `world_size` was recorded lack the field."""
    return len(list((Path(checkpoint) / DS_TAG).glob("*optim_states.pt")))


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


def is_universal(checkpoint: Path) -> bool:
    """True for a directory that holds a converted (world-size independent) universal checkpoint."""
    checkpoint = Path(checkpoint)
    return (checkpoint / _LATEST_UNIVERSAL).is_file() and (checkpoint / DS_TAG / "zero").is_dir()


def enable_universal_loading(accelerator: Accelerator) -> None:
    """Make the DeepSpeed engine read universal checkpoints. Must run before `accelerator.prepare`."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        raise RuntimeError("internal: universal checkpoint loading requested without DeepSpeed")
    plugin.deepspeed_config.setdefault("checkpoint", {})["load_universal"] = True


def prepare_resume(accelerator: Accelerator, checkpoint: Path) -> Path:
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


def convert_to_universal(checkpoint: Path) -> Path:
    """Write `checkpoint/universal/` with DeepSpeed's converter; atomic (staging dir + rename). One process.

    The converter runs as a subprocess: it forks worker pools and loads every shard at once, which must
    not happen inside a training process holding a process group (and its memory is freed on exit).
    `--inject_missing_state` is needed for ZeRO-1/2: the converter asserts on `universal_checkpoint_info`,
    which DeepSpeed only records for Megatron-style models, never for a plain torch/HF module.
    """
    checkpoint = Path(checkpoint)
    final = checkpoint / UNIVERSAL_DIR
    with building_dir(final) as staging:
        cmd = [
            sys.executable,
            "-m",
            "deepspeed.checkpoint.ds_to_universal",
            "--input_folder",
            str(checkpoint / DS_TAG),
            "--output_folder",
            str(staging / DS_TAG),
            "--inject_missing_state",
            "--num_extract_workers",
            str(max(1, min(4, os.cpu_count() or 1))),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(
                f"DeepSpeed's ds_to_universal failed on {checkpoint} (exit {proc.returncode}); resume at the "
                f"world size that wrote it instead. Command: {' '.join(cmd)}\n{proc.stdout[-2000:]}"
                f"{proc.stderr[-3000:]}"
            )
        # Everything accelerate reads besides the engine's files, plus trainer_state.json / latest, so the
        # converted directory is itself a complete checkpoint (`train.resume` may point at it). DeepSpeed's
        # zero_to_fp32.py / zero_to_torch.py read sharded files only: they stay with the original.
        for entry in checkpoint.iterdir():
            if entry.name in (DS_TAG, UNIVERSAL_DIR) or entry.name.startswith(("zero_to_", ".")):
                continue
            if entry.is_dir():
                shutil.copytree(entry, staging / entry.name)
            else:
                shutil.copy2(entry, staging / entry.name)
    publish_dir(staging, final)
    return final


def rescale_data_position(
    state: TrainerState, micro_batch_size: int, new_world: int, batches_per_epoch: int
) -> TrainerState:
    """The loop position at `new_world` processes that skips the same samples as `state` did.

    `batches_in_epoch` counts PER-RANK micro-batches, so it means a different number of samples at another
    world size. accelerate shards batch k of the (world-size independent, seeded) global permutation to
    rank k % world, so the first `batches_in_epoch * old_world` global batches were consumed; skipping
    `samples / (micro_batch_size * new_world)` per-rank batches at the new world size skips exactly those.
    Assumes `micro_batch_size` is unchanged. When it does not divide evenly the count is rounded down
    (a few samples are trained on twice) with a warning; a position at or past the end of the new,
    shorter epoch moves to the start of the next epoch.
    """
    if state.world_size == new_world:
        return state
    samples = state.batches_in_epoch * micro_batch_size * state.world_size
    per_round = micro_batch_size * new_world
    skip, leftover = divmod(samples, per_round)
    if leftover:
        warnings.warn(
            f"resuming at {new_world} processes from a checkpoint of {state.world_size}: {samples} samples "
            f"of epoch {state.epoch} were consumed, not a multiple of micro_batch_size x processes "
            f"({per_round}); skipping {skip * per_round}, so {leftover} samples are trained on twice",
            stacklevel=2,
        )
    if skip >= batches_per_epoch:
        return replace(state, epoch=state.epoch + 1, batches_in_epoch=0, world_size=new_world)
    return replace(state, batches_in_epoch=skip, world_size=new_world)


def adapt_to_world_size(
    accelerator: Accelerator,
    state: TrainerState,
    loaded_from: Path,
    train: TrainConfig,
    batches_per_epoch: int,
) -> TrainerState:
    """After `load_checkpoint`: make a checkpoint written at another world size continue correctly.

    Call on EVERY rank. Returns `state` unchanged at the same world size. Otherwise it
    - recomputes the data position (`rescale_data_position`);
      (the loop cuts accumulation windows from this position, which every rank reads from the same
      trainer_state.json, so the ranks agree on which micro-batch ends a window);
    - gives a rank without `random_states_{rank}.pkl` rank 0's RNG state. accelerate skips a missing file
      silently; rank 0's state is what a fresh run has there too, since every rank calls
      `set_seed(train.seed)` (not device-specific). Exact RNG continuity across a world-size change is
      impossible anyway: the per-rank streams of the old run cannot be split or merged.
    """
    new_world = accelerator.num_processes
    if state.world_size == new_world:
        return state
    old_world = state.world_size
    adjusted = rescale_data_position(state, train.micro_batch_size, new_world, batches_per_epoch)
    rng_file = Path(loaded_from) / f"random_states_{accelerator.process_index}.pkl"
    if not rng_file.is_file() and (Path(loaded_from) / "random_states_0.pkl").is_file():
        load_accelerator_state(str(loaded_from), [], [], [], [], process_index=0, scaler=None)
    if adjusted.batches_in_epoch % train.gradient_accumulation_steps:
        accelerator.print(
            f"warning: resuming at micro-batch {adjusted.batches_in_epoch} of the epoch, not a multiple of "
            f"gradient_accumulation_steps ({train.gradient_accumulation_steps}): the first optimizer step "
            "after resume accumulates fewer micro-batches"
        )
    global_batch = train.global_batch_size(new_world)
    if state.global_step and state.samples_seen % state.global_step == 0:
        old_batch = state.samples_seen // state.global_step
        if old_batch != global_batch:
            accum, rest = divmod(old_batch, train.micro_batch_size * new_world)
            hint = f"; set train.gradient_accumulation_steps={accum} to keep it" if accum and not rest else ""
            accelerator.print(
                f"note: the global batch changes from {old_batch} to {global_batch} samples per optimizer "
                f"step with {new_world} processes{hint}"
            )
    accelerator.print(
        f"resume: {old_world} -> {new_world} processes; continuing epoch {adjusted.epoch} after "
        f"{adjusted.batches_in_epoch} micro-batches per process (was {state.batches_in_epoch})"
    )
    return adjusted
