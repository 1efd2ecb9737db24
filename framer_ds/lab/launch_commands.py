"""The `accelerate launch` line `framer-ds plan` recommends: the shipped accelerate YAML and DeepSpeed JSON
for the strategy and the hardware, with the counts the YAML does not already say.

Why its own module: which shipped file launches which strategy on how many GPUs and nodes is a fact about
configs/, kept in one place; tests/lab/test_planner.py checks every file it names exists.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from framer_ds.lab.hardware import Hardware

SINGLE_NODE_SIZES = (1, 2, 4, 8)


def launch_command(
    strategy: str, hardware: Hardware, config_path: str, overrides: Sequence[str], deepspeed_dir: Path
) -> str:
    """The `accelerate launch` line for the shipped configs (one line per node when multi-node)."""
    tail = ["-m", "framer_ds", "train", config_path, *overrides]
    if strategy == "fsdp2":
        return shlex.join(["accelerate", "launch", *_fsdp2_launch(hardware), *tail])
    if hardware.nodes > 1:
        head = ["--config_file", "configs/accelerate_multinode.yaml"]
        head += ["--num_machines", str(hardware.nodes), "--num_processes", str(hardware.world)]
        head += ["--machine_rank", "RANK", "--main_process_ip", "HEAD_NODE", "--main_process_port", "29500"]
        if strategy == "ddp":
            head = ["--multi_gpu", *head[2:]]
    elif strategy == "ddp":
        head = ["--multi_gpu"] if hardware.world > 1 else []
        head += ["--num_processes", str(hardware.world)]
    elif hardware.world == 1:  # accelerate_1gpu.yaml runs without DeepSpeed
        head = ["--config_file", "configs/accelerate_1gpu_offload.yaml"]
    else:
        size = hardware.world if hardware.world in SINGLE_NODE_SIZES else 8
        head = ["--config_file", f"configs/accelerate_{size}gpu.yaml"]
        if size != hardware.world:
            head += ["--num_processes", str(hardware.world)]
    if strategy != "ddp":
        head += ["--deepspeed_config_file", str(deepspeed_dir / f"{strategy}.json")]
    return shlex.join(["accelerate", "launch", *head, *tail])


def _fsdp2_launch(hardware: Hardware) -> list[str]:
    """The shipped FSDP2 accelerate YAML for this hardware, with the counts it does not already say."""
    if hardware.nodes > 1:
        return [
            "--config_file", "configs/accelerate_fsdp2_multinode.yaml",
            "--num_machines", str(hardware.nodes), "--num_processes", str(hardware.world),
            "--machine_rank", "RANK", "--main_process_ip", "HEAD_NODE", "--main_process_port", "29500",
        ]  # fmt: skip
    size = 4 if hardware.world <= 4 else 8
    head = ["--config_file", f"configs/accelerate_fsdp2_{size}gpu.yaml"]
    return head + (["--num_processes", str(hardware.world)] if size != hardware.world else [])
