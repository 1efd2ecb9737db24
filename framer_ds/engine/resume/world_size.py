"""Continue a checkpoint at another number of processes: the data position and the per-rank RNG.

Any strategy: a DDP / single-process checkpoint loads at any world size as it is, a ZeRO one through its
universal conversion (`strategy.py`); either way the loop position stored per rank must be rescaled.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path

from accelerate import Accelerator

from framer_ds.config.schema import TrainConfig
from framer_ds.engine.checkpoint import TrainerState
from framer_ds.engine.rng import seed_training_draws


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
    - gives a rank without `random_states_{rank}.pkl` (more processes than the checkpoint had) a stream of
      its own, seeded from (train.seed, rank, the resumed step) by `seed_training_draws`: accelerate skips
      the missing file silently, which left the rank on the fresh run's stream of step 0. Ranks that had a
      stream continue it exactly (2 -> 1: rank 0 goes on with rank 0's draws; the other ranks' streams
      end). Exact continuity of the whole run's draws across a world-size change is impossible anyway:
      the per-rank streams of the old run cannot be split or merged.
    """
    new_world = accelerator.num_processes
    if state.world_size == new_world:
        return state
    old_world = state.world_size
    adjusted = rescale_data_position(state, train.micro_batch_size, new_world, batches_per_epoch)
    if not (Path(loaded_from) / f"random_states_{accelerator.process_index}.pkl").is_file():
        seed_training_draws(train.seed, accelerator.process_index, step=state.global_step)
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
