"""GPU-only checks (skipped without CUDA): bf16 training and the GPU memory metrics, fp16 overflow skips."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import REPO, accelerate_launch_cmd, launch_env, mlp_config, read_metrics, train_in_process
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


# --- fp16 overflow: a step the loss scaler skipped is not a trained step (train/overflow.py) -------------

OVERFLOW_STEPS = 12


def overflow_lines(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """(skip lines, training lines) of an fp16 run's metrics.jsonl."""
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    skips = [x for x in lines if "train/skipped_steps" in x and "loss" not in x]
    return skips, [x for x in lines if "loss" in x]


def assert_skips_then_training(run_dir: Path, start_scale: float, skipped: int) -> None:
    """The scale starts far too high: the first `skipped` windows (at least one) overflow, each skipped
    before step 1 and halving the scale; then OVERFLOW_STEPS steps train, each logged once with the count
    and the scale; the optimizer and the LR schedule moved once per trained step."""
    skips, train = overflow_lines(run_dir)
    assert skipped >= 1
    assert len(skips) == skipped
    first = skips[: len([x for x in skips if x["step"] == 1])]
    assert first, skips  # the run starts with a streak of skips, before any step trained
    assert [x["train/loss_scale"] for x in first] == [start_scale / 2**i for i in range(1, len(first) + 1)]
    assert [x["train/skipped_steps"] for x in skips] == list(range(1, skipped + 1))
    assert [x["step"] for x in train] == list(range(1, OVERFLOW_STEPS + 1))
    assert train[-1]["train/skipped_steps"] == skipped
    assert train[0]["train/loss_scale"] == start_scale / 2 ** len(first)
    state = json.loads(
        (run_dir / "checkpoints" / f"step_{OVERFLOW_STEPS}" / "trainer_state.json").read_text()
    )
    assert (state["global_step"], state["skipped_steps"]) == (OVERFLOW_STEPS, skipped)


def overflow_config(tmp_path: Path) -> Path:
    return mlp_config(
        tmp_path / "c.yaml",
        tmp_path / "run",
        train={
            "length.steps": OVERFLOW_STEPS,
            "mixed_precision": "fp16",
            "checkpoint.every.steps": OVERFLOW_STEPS,
            "nonfinite.max_consecutive": 60,  # the scale comes down ~20 halvings before it fits
        },
    )


def test_fp16_gradscaler_overflow_skips_are_counted_not_trained(tmp_path, monkeypatch):
    """accelerate's GradScaler with framer_ds's fused AdamW (whose skipped steps accelerate's own
    `step_was_skipped` misses), started at 2^40 instead of 2^16: the fp16 backward overflows until the
    scale has come down."""
    import framer_ds.train.loop as loop

    build = loop.build_accelerator

    def huge_initial_scale(config, **kwargs):
        accelerator = build(config, **kwargs)
        assert accelerator.scaler is not None  # fp16 on a GPU
        accelerator.scaler = torch.amp.GradScaler("cuda", init_scale=2.0**40)
        return accelerator

    monkeypatch.setattr(loop, "build_accelerator", huge_initial_scale)
    result = train_in_process(overflow_config(tmp_path))
    assert result.global_step == OVERFLOW_STEPS
    assert_skips_then_training(tmp_path / "run", 2.0**40, result.skipped_steps)
    optimizer = torch.load(
        tmp_path / "run" / "checkpoints" / f"step_{OVERFLOW_STEPS}" / "optimizer.bin", weights_only=True
    )
    assert {float(s["step"]) for s in optimizer["state"].values()} == {float(OVERFLOW_STEPS)}


def test_fp16_deepspeed_overflow_skips_are_counted_not_trained(tmp_path):
    """DeepSpeed ZeRO-2 in fp16 on one GPU with its dynamic scale started at 2^32 (hysteresis 1: every
    overflow halves it), the engine's "OVERFLOW! Skipping step"."""
    ds = json.loads((REPO / "configs" / "deepspeed" / "zero2.json").read_text())
    ds["fp16"] = {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 32, "hysteresis": 1}
    (tmp_path / "zero2_fp16.json").write_text(json.dumps(ds))
    cmd = accelerate_launch_cmd(
        "--config_file",
        "configs/accelerate_cpu_2proc.yaml",
        "--num_processes",
        "1",
        "--deepspeed_config_file",
        str(tmp_path / "zero2_fp16.json"),
        "-m",
        "framer_ds",
        "train",
        str(overflow_config(tmp_path)),
    )
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    done = [line for line in proc.stdout.splitlines() if line.startswith("done:")]
    assert len(done) == 1 and done[0].startswith(f"done: {OVERFLOW_STEPS} steps ("), proc.stdout[-3000:]
    skipped = int(done[0].split("(")[1].split()[0])
    assert_skips_then_training(tmp_path / "run", 2.0**32, skipped)
