"""Resume at a different world size: 2 processes -> 1 and 1 -> 2, ZeRO-2, ZeRO-3 and DDP, no JSON edits.

Each case resumes a copy of an uninterrupted run's step-4 checkpoint at the other world size with the
gradient accumulation scaled so the global batch is unchanged (2 processes x accumulation 2 ==
1 process x accumulation 4 == 32 samples per optimizer step), and checks steps 5..8 against the
uninterrupted 2-process run.

Tolerances: with the same global batch the resumed run trains on the same samples with the same restored
weights, Adam moments (per param group, tests/engine/test_zero3_universal_groups.py), step counts and LR;
only the order of the fp32 sums differs: a gradient is 4 micro-batches summed in one process or 2 per rank
then all-reduced, and the logged loss the mean of the same 4 micro-batch losses. So the resumed run does
the same fp32 operations as the uninterrupted one in another order, and differs by roundings:
- a loss by at most a few float32 ulps: step 5's is the same forward on the same weights averaged in
  another order (4 positive terms: at most 3 roundings), later ones see weights off by the roundings
  below. LOSS_REL = 2^-20, 8 ulps. Measured: 1 ulp (7.9e-8, step 5 of the 2->1 cases), every other step
  of every case bit-identical.
- a weight by one rounding of itself per step whose order differed (rtol 2^-20: 8 steps x 2^-23; a 1->2
  case's steps 1..4 ran in the other order too), plus where the micro-batch gradients of an element
  nearly cancel, a difference in Adam's step lr x m/(sqrt(v)+eps) of a small fraction of lr (atol
  LR x 2^-13 = 1.2e-7). Measured: at most 1.5e-8 absolute, 3.7e-9 beyond 4 ulps of the weight.
Faults are orders of magnitude larger: a lost per-group step count (DeepSpeed's ZeRO-3 universal loader,
before engine/resume/zero3_groups.py) moved step 6 by 2.1e-5 and step 8 by 7.3e-4 relative; resuming
2->1 WITHOUT rescaling the data position (re-training 64 samples) moves steps 5..8 by 0.6% to 17%.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import (
    REPO,
    accelerate_launch_cmd,
    launch_env,
    mlp_config,
    read_metrics,
    strategy_launch_args,
    train_in_process,
)
from framer_ds.cli.main import main as cli_main
from framer_ds.engine.checkpoint import TrainerState
from framer_ds.engine.resume.universal import UNIVERSAL_DIR, is_universal
from framer_ds.engine.resume.world_size import rescale_data_position
from framer_ds.engine.rng import rank_stream_seed, seed_training_draws

# A case launches up to three runs (the shared uninterrupted ones on first use): above the default 300 s.
pytestmark = pytest.mark.timeout(900)
LOSS_REL = 2**-20  # 8 float32 ulps: see the module docstring
LR = 1e-3  # mlp_config's learning rate, the largest step Adam's update is a fraction of
WEIGHT_RTOL, WEIGHT_ATOL = 2**-20, LR * 2**-13
TRAIN = {"length.steps": 8, "checkpoint.every.steps": 4}


def launch(launch_args: list[str], config: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = accelerate_launch_cmd(*launch_args, "-m", "framer_ds", "train", str(config), *overrides)
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def one_process(strategy: str, json_dir: Path) -> list[str]:
    """The strategy's launch flags with one process (`--num_processes` overrides the YAML's 2)."""
    return [*strategy_launch_args(strategy, json_dir), "--num_processes", "1"]


class Runs:
    """Uninterrupted 8-step runs, trained once per module and shared by the cases that need them."""

    def __init__(self, root: Path):
        self.root = root
        self.done: dict[str, Path] = {}

    def get(self, name: str, launch_args: list[str] | None, accumulation: int) -> Path:
        """`launch_args` None: one plain process, trained in this one (`framer-ds train` as `accelerate
        launch --num_processes 1` runs it: measured 2.0 CPU s here against 7.5 s for the launch)."""
        if name not in self.done:
            run_dir = self.root / name
            config = mlp_config(
                self.root / f"{name}.yaml",
                run_dir,
                train={**TRAIN, "gradient_accumulation_steps": accumulation},
            )
            if launch_args is None:
                train_in_process(config)
            else:
                launch(launch_args, config)
            self.done[name] = run_dir
        return self.done[name]

    def two_process(self, strategy: str) -> Path:
        return self.get(f"{strategy}_2proc", strategy_launch_args(strategy, self.root), 2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("world_size"))


def resume_copy(source: Path, tmp_path: Path, launch_args: list[str], accumulation: int):
    """Copy `source`'s step-4 checkpoint into a fresh run dir and resume it with `launch_args`."""
    run_dir = tmp_path / "resumed"
    shutil.copytree(source / "checkpoints" / "step_4", run_dir / "checkpoints" / "step_4")
    config = mlp_config(tmp_path / "resume.yaml", run_dir, train=TRAIN)
    proc = launch(
        launch_args, config, "train.resume=latest", f"train.gradient_accumulation_steps={accumulation}"
    )
    return run_dir, proc


def assert_continues(resumed: Path, reference: Path) -> None:
    got, want = read_metrics(resumed)[0], {x["step"]: x for x in read_metrics(reference)[0]}
    assert [x["step"] for x in got] == [5, 6, 7, 8]
    for line in got:
        ref = want[line["step"]]
        assert math.isfinite(line["loss"])
        assert line["loss"] == pytest.approx(ref["loss"], rel=LOSS_REL), f"step {line['step']}"
        assert line["samples"] == ref["samples"] == 32.0 * line["step"]
        assert line["lr"] == pytest.approx(ref["lr"], rel=1e-6)
    weights, ref_weights = (load_file(run / "final" / "model.safetensors") for run in (resumed, reference))
    assert set(weights) == set(ref_weights)
    for name, tensor in ref_weights.items():
        torch.testing.assert_close(weights[name], tensor, rtol=WEIGHT_RTOL, atol=WEIGHT_ATOL)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_zero_two_processes_to_one(runs, strategy, tmp_path):
    reference = runs.two_process(strategy)
    resumed, proc = resume_copy(reference, tmp_path, one_process(strategy, tmp_path), accumulation=4)
    assert "sharded over 2 processes but this run has 1; converted it once" in proc.stdout
    assert is_universal(resumed / "checkpoints" / "step_4" / UNIVERSAL_DIR)
    assert_continues(resumed, reference)
    # The resumed run's own checkpoint is an ordinary 1-process ZeRO checkpoint.
    assert len(list((resumed / "checkpoints" / "step_8" / "pytorch_model").glob("*optim_states.pt"))) == 1


@pytest.mark.distributed
@pytest.mark.slow
def test_zero2_one_process_to_two(runs, tmp_path, capsys):
    """Rank 1 finds no random_states_1.pkl and no shard of its own; accumulation halves to 2."""
    source = runs.get("zero2_1proc", one_process("zero2", runs.root), accumulation=4)
    resumed, proc = resume_copy(source, tmp_path, strategy_launch_args("zero2", tmp_path), accumulation=2)
    assert "sharded over 1 processes but this run has 2; converted it once" in proc.stdout
    assert not (resumed / "checkpoints" / "step_4" / UNIVERSAL_DIR / "random_states_1.pkl").exists()
    assert_continues(resumed, runs.two_process("zero2"))
    # The documented ahead-of-time command converts once, then reuses.
    step_8 = resumed / "checkpoints" / "step_8"
    assert cli_main(["checkpoint", "universal", str(step_8)]) == 0 and is_universal(step_8 / UNIVERSAL_DIR)
    assert (
        cli_main(["checkpoint", "universal", str(step_8)]) == 0
        and "already exists" in capsys.readouterr().out
    )


@pytest.mark.distributed
@pytest.mark.slow
def test_zero3_one_process_to_two(runs, tmp_path):
    """Rank 1 takes its own partition (each parameter padded to an even split) of the universal tensors."""
    source = runs.get("zero3_1proc", one_process("zero3", runs.root), accumulation=4)
    resumed, proc = resume_copy(source, tmp_path, strategy_launch_args("zero3", tmp_path), accumulation=2)
    assert "sharded over 1 processes but this run has 2; converted it once" in proc.stdout
    assert_continues(resumed, runs.two_process("zero3"))


@pytest.mark.distributed
@pytest.mark.slow
def test_ddp_one_process_to_two_needs_no_conversion(runs, tmp_path):
    """model.safetensors + optimizer.bin are unsharded: they load at any world size as they are; the data
    position and the accumulation counter are still rescaled. Compared with the 2-process ZeRO-2 run,
    which test_strategy_equivalence shows equals DDP to 1e-5."""
    source = runs.get("single_1proc", None, accumulation=4)
    assert (source / "checkpoints" / "step_4" / "model.safetensors").is_file()
    resumed, proc = resume_copy(source, tmp_path, strategy_launch_args("ddp", tmp_path), accumulation=2)
    assert "converted" not in proc.stdout
    assert "resume: 1 -> 2 processes; continuing epoch 0 after 8 micro-batches" in proc.stdout
    assert_continues(resumed, runs.two_process("zero2"))


def test_rescale_skips_the_same_samples():
    # 2 ranks x 8 batches x 8 samples = 128 samples -> 16 batches at 1 rank, and back.
    state = TrainerState(global_step=4, epoch=0, batches_in_epoch=8, samples_seen=128, world_size=2)
    one = rescale_data_position(state, micro_batch_size=8, new_world=1, batches_per_epoch=64)
    assert (one.batches_in_epoch, one.world_size, one.epoch) == (16, 1, 0)
    assert rescale_data_position(one, 8, 2, batches_per_epoch=32) == state
    assert rescale_data_position(state, 8, 2, batches_per_epoch=32) is state


def test_rescale_rounds_down_with_a_warning_and_rolls_over_a_finished_epoch():
    state = TrainerState(global_step=3, epoch=1, batches_in_epoch=3, samples_seen=0, world_size=1)
    with pytest.warns(UserWarning, match="4 samples are trained on twice"):
        two = rescale_data_position(state, micro_batch_size=4, new_world=2, batches_per_epoch=10)
    assert two.batches_in_epoch == 1  # 12 samples consumed, 8 skipped
    # 33 batches of 1 rank = 16 batches per rank at 2 ranks, the whole (shorter) epoch: go to the next.
    tail = TrainerState(epoch=0, batches_in_epoch=32, world_size=1)
    rolled = rescale_data_position(tail, micro_batch_size=1, new_world=2, batches_per_epoch=16)
    assert (rolled.epoch, rolled.batches_in_epoch) == (1, 0)


def test_each_rank_draws_from_a_stream_of_its_own():
    """Rank 0 keeps the seed (a one-process run draws what it always drew); every other (seed, rank) and
    a rank that joins a resumed run at another step get streams no other rank or seed shares (seed + rank
    would give rank 1 of seed 0 the draws of rank 0 of seed 1)."""
    assert rank_stream_seed(42, 0) == 42
    cases = [(seed, rank, step) for seed in (0, 1, 42) for rank in range(8) for step in (0, 4)]
    seeds = {rank_stream_seed(*case) for case in cases}
    assert len(seeds) == 3 * 8 * 2  # all distinct
    assert all(0 <= seed < 2**32 for seed in seeds)  # numpy's legacy seeding takes no more
    with torch.random.fork_rng():
        draws = []
        for rank in (0, 1):
            seed_training_draws(7, rank)
            draws.append(torch.randn(4))
        assert not torch.equal(*draws)
        seed_training_draws(7, 1)
        assert torch.equal(torch.randn(4), draws[1])  # a stream is its seed's, wherever it is started
