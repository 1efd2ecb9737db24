"""Real 2-process runs on CPU: `accelerate launch` with gloo and DeepSpeed's CPU accelerator."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import ViTForImageClassification

from conftest import REPO, TINY_VIT_OVERRIDES, accelerate_launch_cmd, read_metrics

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

STRATEGIES = {
    "ddp": ["--multi_gpu", "--num_processes", "2"],
    "zero2": ["--config_file", "configs/accelerate_cpu_2proc.yaml"],
    "zero3": [
        "--config_file",
        "configs/accelerate_cpu_2proc.yaml",
        "--deepspeed_config_file",
        "configs/deepspeed/zero3.json",
    ],
}


def launch(strategy: str, run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = accelerate_launch_cmd(
        *STRATEGIES[strategy],
        "-m",
        "framer_ds",
        "train",
        "configs/quickstart.yaml",
        f"output_dir={run_dir}",
        *TINY_VIT_OVERRIDES,
        *overrides,
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=540)


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_two_process_run(strategy, tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(
        strategy,
        run_dir,
        "train.length.steps=4",
        "train.gradient_accumulation_steps=2",
        "train.checkpoint.every.steps=2",
        "train.eval.every.steps=4",
        "train.eval.best_metric=eval/accuracy",
        "train.eval.best_mode=max",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    train_lines, eval_lines = read_metrics(run_dir)
    # Only rank 0 writes: each step appears exactly once.
    assert [x["step"] for x in train_lines] == [1, 2, 3, 4]
    assert [x["step"] for x in eval_lines] == [4]
    # 4 steps x micro-batch 16 x accumulation 2 x 2 ranks = 256 samples; epoch = 1437 // 16 // 2 = 44 batches.
    assert train_lines[-1]["epoch"] == pytest.approx(8 / 44)
    checkpoint = run_dir / "checkpoints" / "step_4"
    assert (checkpoint / "random_states_0.pkl").is_file() and (checkpoint / "random_states_1.pkl").is_file()
    assert not list((run_dir / "checkpoints").glob(".tmp_*"))
    weights = load_file(run_dir / "final" / "model.safetensors")
    assert weights and all(w.numel() > 0 for w in weights.values())
    ViTForImageClassification.from_pretrained(run_dir / "final")
    # best/ is written by every rank like final/ (a collective under ZeRO-3): the one evaluation, at the
    # last step, is the best, so best/ holds the same full weights as final/.
    assert json.loads((run_dir / "best" / "best.json").read_text())["step"] == 4
    best = load_file(run_dir / "best" / "model.safetensors")
    assert best.keys() == weights.keys() and all(torch.equal(best[k], weights[k]) for k in weights)
    ViTForImageClassification.from_pretrained(run_dir / "best")
    assert proc.stdout.count("done: 4 steps") == 1
