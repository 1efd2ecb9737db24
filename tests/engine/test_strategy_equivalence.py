"""Swapping the strategy changes memory and speed, never the result: DDP = ZeRO-2 = ZeRO-2+offload =
ZeRO-3 = ZeRO-3+offload on 2 CPU processes, fp32, same seed, 16 optimizer steps with accumulation 2.

Tolerance: fp32 on CPU; the strategies differ only in the order of floating-point reductions
(gloo all-reduce vs reduce-scatter, bucketed vs per-tensor) and, with offload, DeepSpeed's C++
Adam instead of torch's AdamW. Each step is ~1e-7 relative noise compounded over 16 steps, so
1e-5 relative on the loss is tight enough to catch any real drift (a wrong LR step, a lost
micro-batch, unscaled accumulation all move the loss by >1e-3 within a few steps).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import (
    REFERENCE_SECTIONS,
    REPO,
    accelerate_launch_cmd,
    launch_env,
    launch_strategy_run,
    mlp_config,
    read_metrics,
    strategy_launch_args,
)

# The module fixture launches every strategy before the first test: more than the default 300 s.
pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(900)]

STRATEGIES = ["ddp", "zero2", "zero2_offload", "zero3", "zero3_offload"]
REL_TOL = 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory, ddp_reference_run) -> dict[str, Path]:
    """Each strategy trains one full epoch (512 samples = 16 steps x 8 x 2 accumulation x 2 ranks);
    DDP's run is the session's shared reference."""
    root = tmp_path_factory.mktemp("equivalence")
    results = {"ddp": ddp_reference_run}
    for strategy in STRATEGIES[1:]:
        results[strategy] = launch_strategy_run(strategy, root, strategy, **REFERENCE_SECTIONS)
    return results


def losses(run_dir: Path) -> list[float]:
    return [line["loss"] for line in read_metrics(run_dir)[0]]


@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if s != "ddp"])
def test_losses_match_ddp(runs, strategy):
    reference, other = losses(runs["ddp"]), losses(runs[strategy])
    assert len(reference) == len(other) == 16
    assert reference[-1] < reference[0]  # it learns, so equality is not trivial
    for step, (a, b) in enumerate(zip(reference, other, strict=True), start=1):
        assert b == pytest.approx(a, rel=REL_TOL), f"{strategy} drifts from DDP at step {step}: {a} vs {b}"


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_data_is_sharded_and_covers_the_epoch_once(runs, strategy):
    record = runs[strategy].parent / f"{runs[strategy].name}_ids"
    per_rank = [
        [i for line in (record / f"rank{r}.jsonl").read_text().splitlines() for i in json.loads(line)]
        for r in (0, 1)
    ]
    assert len(per_rank[0]) == len(per_rank[1]) == 256
    assert not set(per_rank[0]) & set(per_rank[1]), "ranks trained on the same samples"
    assert sorted(per_rank[0] + per_rank[1]) == list(range(512)), "one epoch must cover the data exactly once"


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_rank0_logs_and_global_batch(runs, strategy):
    train_lines, eval_lines = read_metrics(runs[strategy])
    assert [x["step"] for x in train_lines] == list(range(1, 17))
    # micro-batch 8 x accumulation 2 x 2 ranks = 32 samples per optimizer step
    assert [x["samples"] for x in train_lines] == [32.0 * s for s in range(1, 17)]
    assert len(eval_lines) == 1
    assert sorted(p.name for p in runs[strategy].iterdir() if not p.name.startswith(".")) == [
        "checkpoints",
        "config.yaml",
        "final",
        "metrics.jsonl",
    ]


@pytest.mark.parametrize("strategy", ["zero2", "zero3_offload"])
def test_deepspeed_buffers_are_sized_from_the_model_and_recorded(runs, strategy):
    """The JSONs' "auto" buffers become element counts from the trained MLP (~0.2M parameters: one
    bucket holding all of them, not 5e8); the test's explicit ZeRO-3 zeros are kept. The run summary
    names both, and the checkpoint keeps the DeepSpeed config as the engine ran it."""
    from framer_ds.engine.zero_buffers import bucket_for

    summary = json.loads((runs[strategy] / "metrics.jsonl").read_text().splitlines()[0])["run_summary"]
    ran = json.loads((runs[strategy] / "checkpoints" / "step_16" / "deepspeed.json").read_text())
    zero = ran["zero_optimization"]
    trainable = summary["trainable parameters"]
    assert trainable == summary["total parameters"] < 2**20
    bucket = bucket_for(trainable)
    assert trainable <= bucket < trainable + 4096
    assert zero["reduce_bucket_size"] == bucket
    assert f"reduce_bucket_size {bucket:,} (auto)" in summary["DeepSpeed buffers"]
    if strategy == "zero2":
        assert zero["allgather_bucket_size"] == bucket
        assert "stage3" not in summary["DeepSpeed buffers"]
    else:
        assert zero["stage3_prefetch_bucket_size"] == bucket
        assert zero["stage3_max_reuse_distance"] == zero["stage3_param_persistence_threshold"] == 0
        assert summary["DeepSpeed buffers"].endswith("stage3_max_reuse_distance 0")
    assert ran["train_micro_batch_size_per_gpu"] == 8 and ran["gradient_accumulation_steps"] == 2


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_exported_weights_reproduce_the_trained_model(runs, strategy):
    """final/model.safetensors loaded into the plain model gives the logged eval loss; all strategies
    export the same weights."""
    from framer_test_tasks import Mlp, RegressionSet

    weights = load_file(runs[strategy] / "final" / "model.safetensors")
    model = Mlp(32, 256, 4)
    model.load_state_dict(weights)
    data = RegressionSet(64, 32, seed=1, poison=set())
    with torch.no_grad():
        eval_loss = ((model(data.x) - data.y) ** 2).mean().item()
    logged = read_metrics(runs[strategy])[1][-1]["eval/loss"]
    assert eval_loss == pytest.approx(logged, rel=1e-5)
    reference = load_file(runs["ddp"] / "final" / "model.safetensors")
    for name, tensor in reference.items():
        torch.testing.assert_close(weights[name], tensor, rtol=1e-4, atol=1e-6)


ZERO_TO_FP32 = """
import runpy, sys
for checkpoint, out in zip(sys.argv[1::2], sys.argv[2::2]):
    script = checkpoint + "/zero_to_fp32.py"
    sys.argv = [script, checkpoint, out, "--safe_serialization"]
    runpy.run_path(script, run_name="__main__")
"""


@pytest.fixture(scope="module")
def fp32_exports(runs, tmp_path_factory) -> dict[str, Path]:
    """The zero_to_fp32.py each ZeRO-2 / ZeRO-3 step-16 checkpoint carries, run on it as
    `python zero_to_fp32.py CHECKPOINT OUT --safe_serialization` runs it (as __main__, with that argv),
    both in ONE process: the interpreter's and DeepSpeed's imports (~3.5 CPU s) paid once, not per
    checkpoint. Their output folders, by strategy."""
    root = tmp_path_factory.mktemp("fp32")
    outs = {strategy: root / strategy for strategy in ("zero2", "zero3")}
    pairs = [str(x) for s, out in outs.items() for x in (runs[s] / "checkpoints" / "step_16", out)]
    proc = subprocess.run(
        [*accelerate_launch_cmd()[:1], "-c", ZERO_TO_FP32, *pairs],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return outs


@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_deepspeed_zero_to_fp32_reads_our_checkpoints(runs, fp32_exports, strategy):
    consolidated = load_file(next(fp32_exports[strategy].glob("*.safetensors")))
    final = load_file(runs[strategy] / "final" / "model.safetensors")
    assert set(consolidated) == set(final)
    for name in final:
        torch.testing.assert_close(consolidated[name], final[name])


# One run per checkpoint layout: DDP's, ZeRO-2's (here with the optimizer on the host, restored through
# the offload path) and ZeRO-3's partitioned one; plain ZeRO-2 and ZeRO-3 + offload write the same files.
@pytest.mark.parametrize("strategy", ["ddp", "zero2_offload", "zero3"])
def test_sigkill_mid_save_then_resume_repeats_the_uninterrupted_losses(runs, strategy, tmp_path):
    """Rank 0 is SIGKILLed while writing the step-8 checkpoint: step_4 stays intact, the half-written
    one is never picked, and `resume: latest` reproduces the uninterrupted run from step 5 on."""
    run_dir = tmp_path / "run"
    config = mlp_config(
        tmp_path / "c.yaml", run_dir, train={"checkpoint.every.steps": 4, "checkpoint.keep_last": 3}
    )
    cmd = accelerate_launch_cmd(
        *strategy_launch_args(strategy, tmp_path), "-m", "framer_ds", "train", str(config)
    )
    env = {**launch_env(), "FRAMER_TEST_KILL_DURING_SAVE": "8"}
    killed = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert killed.returncode != 0
    checkpoints = run_dir / "checkpoints"
    assert (checkpoints / "step_4" / "trainer_state.json").is_file()
    assert (checkpoints / ".tmp_step_8").is_dir() and not (checkpoints / "step_8").exists()

    resumed = subprocess.run(
        [*cmd, "train.resume=latest"], cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr[-5000:]
    assert "resumed from" in resumed.stdout and "step_4" in resumed.stdout
    got, want = losses(run_dir), losses(runs[strategy])
    assert [x["step"] for x in read_metrics(run_dir)[0]] == list(range(1, 17))
    for step in range(4, 16):
        assert got[step] == pytest.approx(want[step], rel=REL_TOL), (
            f"step {step + 1}: {want[step]} vs {got[step]}"
        )
    assert not (checkpoints / ".tmp_step_8").exists()  # cleaned by the next successful save
