"""After a ZeRO-3 universal load: each optimizer param group gets back its own step count and settings.

Why this exists: DeepSpeed's ZeRO-3 universal loader
(`DeepSpeedZeroOptimizer_Stage3.load_hp_checkpoint_state_from_checkpoint_dir_stage3`, DeepSpeed 0.19.8)
restores the fp32 master weights and both Adam moments per parameter exactly, but
- gives EVERY sub-group the step count of the checkpoint's first one, as one shared tensor object
  (`state[fp32_flat]["step"] = state_step`). torch's AdamW advances that tensor in place (as does offload's
  DeepSpeedCPUAdam `+= 1` when the count is a tensor, not its own int), and ZeRO-3 runs the optimizer
  once per sub-group, so with two param groups (train/run.py
  `decay_groups`: matrices with weight decay, biases and norm weights without) the shared count moves
  by 2 per step after the resume: the second group's bias correction uses step t+1, t+3, ... instead of
  t. That alone is the ~2e-5 the world-size resume test measured; one param group was exact.
- copies the checkpoint's FIRST param group's settings (lr, weight_decay, betas, eps, no_decay, ...) into
  every group. `apply_running_config` then recomputes lr, weight decay, betas and eps, but from the
  `no_decay` marker, which a first group without decay would have stamped on all of them.

ZeRO-1/2's universal loader does both per group (`base_optimizer.load_hp_checkpoint_state_from_
checkpoint_dir`), and a same-world-size ZeRO-3 load goes through torch's `load_state_dict`: only this
path needs it. Both come from `zero/optimizer_state.pt`, which the converter copies from rank 0's shard:
the base optimizer's `state_dict()`, whose `param_groups[g]["params"]` are the state indices of group g's
sub-groups (`_set_fp32_optimizer_param_groups` appends the flat fp32 partitions group by group).
"""

from __future__ import annotations

from pathlib import Path

import torch

from framer_ds.engine.resume.universal import DS_TAG


def zero3_optimizer(optimizer: torch.optim.Optimizer):
    """DeepSpeed's ZeRO-3 optimizer: `optimizer` itself or the one behind accelerate's wrapper; None
    under any other strategy."""
    for candidate in (optimizer, getattr(optimizer, "optimizer", None)):
        if hasattr(candidate, "fp32_partitioned_groups_flat"):
            return candidate
    return None


def restore_zero3_group_state(optimizer: torch.optim.Optimizer, universal: Path) -> None:
    """Give each param group of a ZeRO-3 optimizer just loaded from the universal checkpoint `universal`
    its own stored settings, and each sub-group its own stored step count (a tensor of its own).

    A no-op under another strategy. Every rank, after `accelerator.load_state`, before
    `apply_running_config` (which then applies the running config on top, as after any other load)."""
    zero = zero3_optimizer(optimizer)
    if zero is None:
        return
    # mmap: the file also holds rank 0's moments of the writing run, which are not read here
    stored = torch.load(
        Path(universal) / DS_TAG / "zero" / "optimizer_state.pt",
        map_location="cpu",
        weights_only=False,
        mmap=True,
    )["optimizer_state_dict"]
    base = zero.optimizer
    if len(stored["param_groups"]) != len(base.param_groups):
        raise RuntimeError(
            f"{universal} holds {len(stored['param_groups'])} optimizer param groups but this run builds "
            f"{len(base.param_groups)}: resume with the model and trainable parameters that wrote it"
        )
    first = stored["param_groups"][0]
    for live, saved in zip(base.param_groups, stored["param_groups"], strict=True):
        for key in set(first) - set(saved):
            live.pop(key, None)  # e.g. `no_decay`: stamped on every group by DeepSpeed's copy of the first
        live.update({key: value for key, value in saved.items() if key != "params"})
    seen: dict[int, int] = {}  # sub-groups of each param group met so far
    for sub_group, flat in enumerate(zero.fp32_partitioned_groups_flat):
        group = zero.sub_group_to_group_id[sub_group]
        indices = stored["param_groups"][group]["params"]
        index = indices[min(seen.get(group, 0), len(indices) - 1)]
        seen[group] = seen.get(group, 0) + 1
        step = stored["state"].get(index, {}).get("step")
        if step is not None:  # None: written before any optimizer step, nothing to give back
            base.state[flat]["step"] = step.clone() if isinstance(step, torch.Tensor) else step
