"""A task that reports a summed loss and its item count gets the gradient of one big batch, however
the batch is cut into micro-batches and ranks; its eval totals give exact token-weighted metrics.

The data (tests/framer_test_tasks.py `test_token_regression`) gives every sample 1..12 valid
positions, so micro-batches hold very different token counts: averaging per-micro-batch means (what
the loop did before count normalisation, and what `test_token_regression_mean` still does) weighs
the tokens of a short micro-batch more and moves the gradient by far more than the tolerance.

Tolerances, from the arithmetic: the runs differ only in the order of fp32 sums (4 micro-batches
summed in one process vs one batch, or an all-reduce), so every compared number differs by rounding
alone. u = 2**-24 is fp32's unit roundoff.
- Losses and eval losses are sums of N non-negative terms (squared errors). Summed in any order, each
  carries a relative error of at most (N-1)u, so two orders differ by at most 2Nu
  (`sum_of_positive_terms_rtol`). The gradient norm is held to the same bound: it is dominated by its
  large entries, sums of the same N terms that do not cancel. N = 32 samples x 12 positions = 384 per
  step gives 4.6e-5; the mean-loss twin is off by more than 1e-3 (test_per_micro_batch_means_would_differ).
  (The old fixed 1e-5 sat below that bound: one 2-core machine failed it every time.)
- Weights: AdamW moves each weight by about lr per step whatever its gradient's size, through the
  ratio m / sqrt(v). A gradient entry that is a sum with cancellation carries a relative rounding error
  of up to Nu times its condition number C (sum of |terms| / |sum|), and the ratio carries it on. We
  allow C up to 1e3 / (N u) ~ 40: 1e-3 of the largest possible travel, lr x steps, absolute
  (`WEIGHT_ATOL`). A relative tolerance on the weights themselves has no such basis: a weight near zero
  after its Adam steps would get none.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from conftest import (
    REPO,
    accelerate_launch_cmd,
    launch_env,
    read_metrics,
    reset_accelerate,
    set_keys,
    strategy_launch_args,
    train_in_process,
)
from framer_ds.tasks.run_config import load_run_config

STEPS = 4
LEARNING_RATE = 1e-2
UNIT_ROUNDOFF = 2.0**-24  # fp32
TERMS_PER_STEP = 32 * 12  # samples x positions summed into one step's loss
WEIGHT_ATOL = 1e-3 * LEARNING_RATE * STEPS


def sum_of_positive_terms_rtol(n_terms: int) -> float:
    """Two fp32 sums of the same n non-negative terms in different orders differ by at most this much
    relative: each is within (n-1)u of the exact sum."""
    return 2 * n_terms * UNIT_ROUNDOFF


REL_TOL = sum_of_positive_terms_rtol(TERMS_PER_STEP)
EVAL_REL_TOL = sum_of_positive_terms_rtol(45 * 12)  # the eval set: 45 samples x 12 positions


def token_config(path: Path, run_dir: Path, task: str = "test_token_regression", **train) -> Path:
    """`train`: dotted keys (conftest.set_keys): `micro_batch_size=8`, `**{"optimizer.max_grad_norm": 1}`."""
    config = {
        "imports": ["framer_test_tasks"],
        "task": task,
        "output_dir": str(run_dir),
        "data": {"record_dir": str(run_dir.parent / f"{run_dir.name}_ids")},
        "train": {
            "seed": 3,
            "length": {"steps": STEPS},
            "optimizer": {
                "learning_rate": LEARNING_RATE,
                "max_grad_norm": 1e6,  # log the norm, never clip: clipping would hide a scale error
            },
            "lr_schedule": {"name": "constant"},
        },
    }
    set_keys(config, train=train)
    (run_dir.parent / f"{run_dir.name}_ids").mkdir(parents=True)
    path.write_text(yaml.safe_dump(config))
    return path


def train_tokens(tmp_path: Path, name: str, task: str = "test_token_regression", **train) -> Path:
    """`token_config` trained in this process into tmp_path/name; the run directory."""
    run_dir = tmp_path / name
    train_in_process(token_config(tmp_path / f"{name}.yaml", run_dir, task, **train))
    return run_dir


def grad_norms(run_dir: Path) -> list[float]:
    return [line["grad_norm"] for line in read_metrics(run_dir)[0]]


@pytest.fixture(scope="module")
def one_batch(tmp_path_factory) -> Path:
    """The reference: each optimizer step is ONE micro-batch of 32 samples."""
    return train_tokens(tmp_path_factory.mktemp("one_batch"), "ref", micro_batch_size=32)


def assert_same_training(run_dir: Path, reference: Path) -> None:
    assert grad_norms(run_dir) == pytest.approx(grad_norms(reference), rel=REL_TOL)
    losses = [line["loss"] for line in read_metrics(run_dir)[0]]
    assert losses == pytest.approx([line["loss"] for line in read_metrics(reference)[0]], rel=REL_TOL)
    weights, expected = (load_file(d / "final" / "model.safetensors") for d in (run_dir, reference))
    for name, tensor in expected.items():
        torch.testing.assert_close(weights[name], tensor, rtol=0, atol=WEIGHT_ATOL)


def test_accumulated_unequal_micro_batches_equal_one_batch(one_batch, tmp_path):
    accumulated = train_tokens(tmp_path, "acc", micro_batch_size=8, gradient_accumulation_steps=4)
    assert_same_training(accumulated, one_batch)


def test_per_micro_batch_means_would_differ(one_batch, tmp_path):
    """The comparison above can fail: the mean-reporting twin of the task, accumulated the same way,
    ends with a different gradient norm on every step."""
    means = train_tokens(
        tmp_path, "mean", "test_token_regression_mean", micro_batch_size=8, gradient_accumulation_steps=4
    )
    reference = grad_norms(
        train_tokens(tmp_path, "mean_ref", "test_token_regression_mean", micro_batch_size=32)
    )
    assert grad_norms(means)[0] != pytest.approx(reference[0], rel=1e-3)


def test_tokens_per_s_counts_the_window_items(one_batch):
    """tokens_per_s / samples_per_s over one step is exactly that step's tokens per sample."""
    from framer_test_tasks import valid_tokens

    ids = [
        json.loads(line) for line in (one_batch.parent / "ref_ids" / "rank0.jsonl").read_text().splitlines()
    ]
    for line, step_ids in zip(read_metrics(one_batch)[0], ids, strict=True):
        tokens = sum(valid_tokens(i, 12) for i in step_ids)
        assert line["tokens_per_s"] / line["samples_per_s"] == pytest.approx(tokens / 32, rel=1e-9)


def expected_eval_loss(run_dir: Path) -> tuple[float, float]:
    """(token-weighted loss, mean of per-sample means) of the exported model on the 45 eval samples."""
    from framer_test_tasks import Mlp, TokenSet

    model = Mlp(16, 64, 2)
    model.load_state_dict(load_file(run_dir / "final" / "model.safetensors"))
    data = TokenSet(45, 12, 16, seed=1)
    with torch.no_grad():
        error = (model(data.x) - data.y).squeeze(-1) ** 2 * data.mask
    per_sample = error.sum(1) / data.mask.sum(1)
    return (error.sum() / data.mask.sum()).item(), per_sample.mean().item()


def test_eval_sums_give_the_token_weighted_loss(one_batch):
    token_weighted, sample_mean = expected_eval_loss(one_batch)
    final_eval = read_metrics(one_batch)[1][-1]
    assert final_eval["eval/samples"] == 45
    assert final_eval["eval/loss"] == pytest.approx(token_weighted, rel=EVAL_REL_TOL)
    assert final_eval["eval/loss"] != pytest.approx(sample_mean, rel=1e-3)


@pytest.mark.distributed
@pytest.mark.parametrize("strategy", ["ddp", "zero2", "fsdp2"])
def test_two_processes_equal_one_batch(one_batch, tmp_path, strategy):
    """2 ranks x accumulation 2 x micro-batch 8: the window's tokens are counted across both ranks
    (under FSDP2 the gradients are reduce-scattered into shards, averaged over the ranks as DDP does).
    The eval set (45 samples, micro-batch 8) pads the last batch across the ranks: the padding is
    dropped from the totals."""
    run_dir = tmp_path / "run"
    config = token_config(tmp_path / "c.yaml", run_dir, micro_batch_size=8, gradient_accumulation_steps=2)
    cmd = accelerate_launch_cmd(
        *strategy_launch_args(strategy, tmp_path), "-m", "framer_ds", "train", str(config)
    )
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert_same_training(run_dir, one_batch)
    final_eval = read_metrics(run_dir)[1][-1]
    assert final_eval["eval/samples"] == 45
    assert final_eval["eval/loss"] == pytest.approx(expected_eval_loss(run_dir)[0], rel=EVAL_REL_TOL)


@pytest.mark.distributed
def test_ddp_gradients_as_bucket_views_clip_like_one_batch(tmp_path):
    """DDP keeps gradients as views into its all-reduce buckets (no second copy of every gradient): the
    accumulated (no_sync) and all-reduced gradients, their norm and the clipping they drive must still be
    those of one big batch. max_grad_norm is far below the norms, so every step clips."""
    clip = {"optimizer.max_grad_norm": 1e-3}
    reference = train_tokens(tmp_path, "ref_clipped", micro_batch_size=32, **clip)
    assert min(grad_norms(reference)) > 10 * clip["optimizer.max_grad_norm"]
    run_dir = tmp_path / "run"
    config = token_config(
        tmp_path / "c.yaml", run_dir, micro_batch_size=8, gradient_accumulation_steps=2, **clip
    )
    cmd = accelerate_launch_cmd(
        *strategy_launch_args("ddp", tmp_path), "-m", "framer_ds", "train", str(config)
    )
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert_same_training(run_dir, reference)


def test_ddp_is_built_with_gradients_as_bucket_views(tmp_path):
    from framer_ds.engine.accelerator import build_accelerator

    config = load_run_config(token_config(tmp_path / "c.yaml", tmp_path / "run"))
    accelerator = build_accelerator(config)
    try:
        assert accelerator.ddp_handler.gradient_as_bucket_view is True
        assert not accelerator.ddp_handler.static_graph
    finally:
        reset_accelerate()
