"""FSDP2 as the third strategy, on 2 CPU processes (gloo): the quickstart gives DDP's losses, is really
sharded, and resumes exactly from its sharded (torch.distributed.checkpoint) state.

One module fixture launches the runs every test here reads: the quickstart under DDP and under FSDP2
(8 optimizer steps, accumulation 2, a checkpoint at step 4 and 8), and the FSDP2 step-4 checkpoint
resumed in a fresh run directory.

Tolerances: FSDP2 vs DDP, 1e-3 relative (the issue's bound). Both are fp32 on CPU and differ only in
the reduction (gloo all-reduce of whole gradients vs reduce-scatter of flat shards, then an all-gather of
the parameters) and in the clipping norm being summed from per-rank shard norms: ~1e-7 relative per step
(measured: steps 1-6 bit-identical, at most 6e-8 relative after), so 1e-3 leaves room for summation order
only; a lost micro-batch, an unscaled accumulation or a gradient not averaged over ranks moves the loss
by >1e-2 within 8 steps. Resume vs straight, 1e-5 relative: the same processes, the same reductions;
restored weights, Adam moments, LR and data position make it bit-identical (measured 0.0), and 1e-5 is
the bound the other strategies' resume tests use.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import REPO, accelerate_launch_cmd, launch_env, read_metrics

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(900)]

FSDP2 = ["--config_file", "configs/accelerate_fsdp2_cpu_2proc.yaml"]
DDP = ["--multi_gpu", "--num_processes", "2"]
QUICKSTART_8_STEPS = [
    "train.length.steps=8",
    "train.gradient_accumulation_steps=2",
    "train.micro_batch_size=16",
    "train.checkpoint.every.steps=4",
    "train.eval.every=null",
    "train.lr_schedule.warmup.steps=2",
]


def train(launch_args: list[str], run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = accelerate_launch_cmd(
        *launch_args, "-m", "framer_ds", "train", "configs/quickstart.yaml", f"output_dir={run_dir}"
    )
    proc = subprocess.run(
        [*cmd, *QUICKSTART_8_STEPS, *overrides],
        cwd=REPO,
        env=launch_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fsdp2")
    train(DDP, root / "ddp")
    train(FSDP2, root / "fsdp2")
    resumed = root / "fsdp2_resumed"
    shutil.copytree(root / "fsdp2" / "checkpoints" / "step_4", resumed / "checkpoints" / "step_4")
    train(FSDP2, resumed, "train.resume=latest")
    return {"ddp": root / "ddp", "fsdp2": root / "fsdp2", "resumed": resumed}


def losses(run_dir: Path) -> dict[int, float]:
    return {line["step"]: line["loss"] for line in read_metrics(run_dir)[0]}


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])["run_summary"]


def test_fsdp2_really_runs_on_cpu_and_wraps_the_task_block(runs):
    """accelerate alone trains 2 unsharded DDP copies here; the summary names what really ran."""
    assert summary(runs["fsdp2"])["strategy"] == "FSDP2 on 2 CPU process(es) + wrapping ViTLayer"
    assert summary(runs["ddp"])["strategy"] == "DDP on 2 CPU processes"


def test_quickstart_losses_match_ddp(runs):
    reference, fsdp2 = losses(runs["ddp"]), losses(runs["fsdp2"])
    assert sorted(reference) == sorted(fsdp2) == list(range(1, 9))
    assert reference[8] < reference[1]  # it learns, so equality is not trivial
    for step, want in reference.items():
        assert fsdp2[step] == pytest.approx(want, rel=1e-3), f"step {step}: DDP {want} vs FSDP2 {fsdp2[step]}"


def test_checkpoint_is_sharded_per_rank_with_the_manifest(runs):
    checkpoint = runs["fsdp2"] / "checkpoints" / "step_4"
    for state in ("pytorch_model_fsdp_0", "optimizer_0"):
        assert sorted(p.name for p in (checkpoint / state).iterdir()) == [
            ".metadata",
            "__0_0.distcp",
            "__1_0.distcp",
        ]
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    listed = json.dumps(manifest)
    assert "pytorch_model_fsdp_0/__1_0.distcp" in listed and "optimizer_0/.metadata" in listed
    assert json.loads((checkpoint / "trainer_state.json").read_text())["world_size"] == 2


def test_four_steps_plus_resume_equal_eight_straight(runs):
    straight, resumed = losses(runs["fsdp2"]), losses(runs["resumed"])
    assert sorted(resumed) == [5, 6, 7, 8]
    for step, loss in resumed.items():
        assert loss == pytest.approx(straight[step], rel=1e-5), f"step {step}"


def test_final_is_the_full_model_equal_to_ddp(runs):
    """final/ is gathered on rank 0 from the shards: every tensor whole, the same as DDP's."""
    ddp, fsdp2 = (load_file(runs[name] / "final" / "model.safetensors") for name in ("ddp", "fsdp2"))
    assert set(fsdp2) == set(ddp)
    for name, tensor in ddp.items():
        assert fsdp2[name].shape == tensor.shape, name
        # 8 Adam steps of lr 2e-3 from the same start: the summation-order noise stays far below 1e-4
        torch.testing.assert_close(fsdp2[name], tensor, rtol=1e-4, atol=1e-5)
