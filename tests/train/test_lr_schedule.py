"""The LR schedule is transformers' to the bit, without importing transformers' trainer (and peft) on
every rank; and `constant` keeps the warmup it is given (transformers' "constant" dropped it)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from transformers.optimization import get_constant_schedule_with_warmup, get_scheduler

from framer_ds.train.lr_schedule import build_lr_scheduler


def _lrs(scheduler: torch.optim.lr_scheduler.LRScheduler, steps: int) -> list[float]:
    values = []
    for _ in range(steps):
        values.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    return values


def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=3e-4)


@pytest.mark.parametrize("kind", ["cosine", "linear"])
@pytest.mark.parametrize(("warmup", "total"), [(0, 7), (3, 10), (10, 10), (5, 1000)])
def test_the_multipliers_equal_transformers_exactly(kind, warmup, total):
    ours = _lrs(build_lr_scheduler(kind, _optimizer(), warmup, total), total + 2)
    theirs = _lrs(
        get_scheduler(kind, _optimizer(), num_warmup_steps=warmup, num_training_steps=total), total + 2
    )
    assert ours == theirs  # the same float operations in the same order: equal, not close


def test_constant_keeps_its_warmup():
    ours = _lrs(build_lr_scheduler("constant", _optimizer(), 4, 12), 12)
    assert ours == _lrs(get_constant_schedule_with_warmup(_optimizer(), num_warmup_steps=4), 12)
    assert ours[0] == 0.0 and ours[2] == pytest.approx(1.5e-4) and ours[4:] == [3e-4] * 8
    # what `get_scheduler("constant", num_warmup_steps=4)` gives: the warmup silently ignored
    assert _lrs(get_scheduler("constant", _optimizer(), num_warmup_steps=4), 2) == [3e-4, 3e-4]


def test_the_training_loop_does_not_import_transformers():
    """Every rank of every launch imports the loop; transformers (and peft through its trainer utils)
    cost ~4 s of CPU per process, wasted for a task that does not use them."""
    code = "import sys, framer_ds.train.loop; print('transformers' in sys.modules, 'peft' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_the_scheduler_state_round_trips_through_a_checkpoint(tmp_path):
    """accelerate's save_state pickles the scheduler: its partials survive; it continues."""
    first = build_lr_scheduler("cosine", _optimizer(), 2, 20)
    _lrs(first, 5)
    torch.save(first.state_dict(), tmp_path / "s.pt")
    second = build_lr_scheduler("cosine", _optimizer(), 2, 20)
    second.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=False))
    assert _lrs(second, 5) == _lrs(first, 5)


def test_the_logged_lr_is_the_one_its_step_ran_at(tmp_path):
    """metrics.jsonl's `lr` at step N is the rate optimizer step N used. It was the next step's (the
    schedule had already moved on): step 1 of a warmup logged 5e-3 while it ran at 0."""
    from test_loss_normalisation import LEARNING_RATE, STEPS, train_tokens

    from conftest import read_metrics

    run_dir = train_tokens(
        tmp_path, "warm", micro_batch_size=8, **{"lr_schedule.name": "linear", "lr_schedule.warmup.steps": 2}
    )
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=LEARNING_RATE)
    ran_at = _lrs(build_lr_scheduler("linear", optimizer, 2, STEPS), STEPS)
    assert ran_at[0] == 0.0
    assert [line["lr"] for line in read_metrics(run_dir)[0]] == ran_at
