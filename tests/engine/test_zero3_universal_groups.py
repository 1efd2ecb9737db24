"""A ZeRO-3 optimizer with two param groups, loaded from DeepSpeed's universal checkpoint, continues
bit for bit (engine/resume/zero3_groups.py).

One process, in this one: DeepSpeed's engine directly (no accelerate launch), a universal conversion of
its step-3 checkpoint (`convert_to_universal`, the resume path's own), and steps 4..6 of a fresh engine
loaded from it compared with the uninterrupted engine. At the same world size the resumed engine runs the
same fp32 operations in the same order on the same partitions as the uninterrupted one, so anything but
bit-identical losses and fp32 master weights means state was lost: the tolerance is 0.

The groups are in the order that shows both of DeepSpeed's losses (its loader gives every sub-group the
first one's step count as ONE shared tensor, which AdamW then advances once per sub-group, and copies the
first group's settings into every group): no-decay vectors first, then decayed matrices. Without the
restore the first resumed step agrees and the next ones differ from 4e-4 relative on (the second group
is updated with step t+1, t+3, ... and with weight decay 0), and the matrices' group says `no_decay`.
The resumes at another number of processes (2 -> 1, 1 -> 2) are tests/engine/test_resume_world_size.py.
"""

from __future__ import annotations

import os

import pytest
import torch

from conftest import free_port
from framer_ds.engine.resume.universal import DS_TAG, convert_to_universal
from framer_ds.engine.resume.zero3_groups import restore_zero3_group_state


@pytest.fixture
def one_process_group():
    """A 1-process gloo group for DeepSpeed in this process; afterwards the group is destroyed and the
    environment is as before (importing DeepSpeed also sets a torch variable or two)."""
    saved = dict(os.environ)
    import deepspeed  # here, not at collection: importing it takes seconds

    port = str(free_port())
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
    yield
    deepspeed.comm.destroy_process_group()
    os.environ.clear()
    os.environ.update(saved)


def zero3_engine(load_universal: bool):
    """A small MLP with a LayerNorm under ZeRO-3, AdamW over [vectors without decay, matrices with]."""
    import deepspeed

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 1)
    )
    groups = [
        {"params": [p for p in model.parameters() if p.ndim < 2], "weight_decay": 0.0, "no_decay": True},
        {"params": [p for p in model.parameters() if p.ndim >= 2], "weight_decay": 0.1},
    ]
    config = {
        "train_micro_batch_size_per_gpu": 8,
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "checkpoint": {"load_universal": load_universal},
    }
    optimizer = torch.optim.AdamW(groups, lr=1e-2)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine


def train_step(engine, step: int) -> float:
    generator = torch.Generator().manual_seed(step)
    inputs, targets = torch.randn(8, 6, generator=generator), torch.randn(8, 1, generator=generator)
    loss = torch.nn.functional.mse_loss(engine(inputs), targets)
    engine.backward(loss)
    engine.step()
    return loss.item()


def group_settings(engine) -> list[dict]:
    return [{k: v for k, v in g.items() if k != "params"} for g in engine.optimizer.optimizer.param_groups]


@pytest.mark.slow  # 12 s idle, ~30 s on busy cores: two engines and the converter's subprocess
def test_two_param_groups_continue_bit_for_bit(one_process_group, tmp_path):
    straight = zero3_engine(load_universal=False)
    for step in range(1, 4):
        train_step(straight, step)
    straight.save_checkpoint(str(tmp_path), tag=DS_TAG)
    settings = group_settings(straight)
    want = [train_step(straight, step) for step in range(4, 7)]

    universal = convert_to_universal(tmp_path)
    resumed = zero3_engine(load_universal=True)
    resumed.load_checkpoint(str(universal), tag=DS_TAG)
    restore_zero3_group_state(resumed.optimizer, universal)

    assert group_settings(resumed) == settings
    state = resumed.optimizer.optimizer.state
    steps = [state[flat]["step"] for flat in resumed.optimizer.fp32_partitioned_groups_flat]
    assert [float(s) for s in steps] == [3.0, 3.0] and steps[0] is not steps[1]
    assert [train_step(resumed, step) for step in range(4, 7)] == want
    masters = (engine.optimizer.fp32_partitioned_groups_flat for engine in (resumed, straight))
    for got, ref in zip(*masters, strict=True):
        assert torch.equal(got, ref)
