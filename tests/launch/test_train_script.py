"""scripts/train/train_lora_multigpu.sh: every environment override reaches the launch, and a config
that fails validation never launches.

A stub `accelerate` records the command line: the script is a one-machine wrapper whose job is to
build that line (and to refuse a bad config before it); the `accelerate launch` it builds is the one
every distributed test runs for real."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

SCRIPT = REPO / "scripts" / "train" / "train_lora_multigpu.sh"
TINY = "configs/tasks/video_lora/tiny.yaml"


def run_script(tmp_path, **env_overrides) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "accelerate"
    stub.write_text(f'#!/usr/bin/env bash\necho "$@" > "{tmp_path}/accelerate_args"\n')
    stub.chmod(0o755)
    venv_bin = Path(sys.executable).parent  # `python` in the script = this interpreter, with its packages
    env = {**os.environ, "PATH": f"{bin_dir}:{venv_bin}:{os.environ['PATH']}", **env_overrides}
    return subprocess.run(
        ["bash", str(SCRIPT), TINY, "train.length.steps=7"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_environment_overrides_really_take_effect(tmp_path):
    proc = run_script(
        tmp_path,
        NUM_GPUS="2",
        BATCH_SIZE="3",
        GRADIENT_ACCUM="5",
        HEIGHT="128",
        WIDTH="192",
        NUM_FRAMES="6",
        DEEPSPEED_CONFIG="configs/deepspeed/zero3.json",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    args = (tmp_path / "accelerate_args").read_text().split()
    assert args[args.index("--num_processes") + 1] == "2"
    assert args[args.index("--deepspeed_config_file") + 1] == "configs/deepspeed/zero3.json"
    for override in (
        "train.micro_batch_size=3",
        "train.gradient_accumulation_steps=5",
        "data.height=128",
        "data.width=192",
        "data.num_frames=6",
        "train.length.steps=7",
    ):
        assert override in args, override
    assert args[args.index("train") + 1] == TINY


def test_a_config_that_fails_validation_is_never_launched(tmp_path):
    proc = run_script(tmp_path, HEIGHT="100")
    assert proc.returncode != 0
    assert "multiple of 64" in proc.stderr
    assert not (tmp_path / "accelerate_args").exists()
