"""GPU-only checks (skipped without CUDA): bf16 training and the GPU memory metrics."""

from __future__ import annotations

import pytest
import torch

from conftest import REPO, read_metrics
from framer_ds.tasks.run_config import load_run_config
from framer_ds.train.loop import run_training

pytestmark = pytest.mark.gpu


def test_quickstart_bf16_on_gpu_logs_gpu_memory(quickstart_overrides, tmp_path):
    config = load_run_config(
        REPO / "configs" / "quickstart.yaml",
        [
            *quickstart_overrides,
            "train.length.steps=20",
            "train.mixed_precision=bf16",
            "train.eval.every.steps=20",
        ],
    )
    run_training(config)
    train_lines, eval_lines = read_metrics(tmp_path / "run")
    assert train_lines[-1]["memory/max_allocated_gb"] > 0
    assert train_lines[-1]["memory/max_reserved_gb"] >= train_lines[-1]["memory/max_allocated_gb"]
    assert train_lines[-1]["loss"] < train_lines[0]["loss"]
    assert 0.0 <= eval_lines[-1]["eval/accuracy"] <= 1.0


def test_seeded_draws_for_samples_and_cache_leave_the_cuda_rng_alone():
    from framer_ds.engine.rng import isolated_seed

    torch.cuda.manual_seed(123)
    before = torch.cuda.get_rng_state()
    with isolated_seed(0):
        torch.randn(4, device="cuda")
    assert torch.equal(torch.cuda.get_rng_state(), before)
