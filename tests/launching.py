"""How the tests start real processes: `accelerate launch` command lines, the launch environment, the flags
and DeepSpeed JSONs of each strategy on 2 CPU processes, and watching a started run (its steps, its ranks,
an abnormal teardown in its stderr). tests/conftest.py re-exports every name, so a test imports them from
conftest as it imports the fixtures' helpers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def accelerate_launch_cmd(*launch_args: str) -> list[str]:
    """`accelerate launch` through this interpreter so the venv's packages are used."""
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--main_process_port",
        str(free_port()),
        *launch_args,
    ]


def write_deepspeed_json(base: str, path: Path, **zero_overrides) -> Path:
    """A shipped DeepSpeed JSON with test tweaks (e.g. stage3_param_persistence_threshold=0 so tiny
    tensors are partitioned too and ZeRO-3 bugs cannot hide behind persistence)."""
    config = json.loads((REPO / "configs" / "deepspeed" / base).read_text())
    config["zero_optimization"].update(zero_overrides)
    path.write_text(json.dumps(config, indent=2))
    return path


# What a C++ runtime or the Python interpreter prints when a process dies during teardown.
ABORT_MARKERS = (
    "terminate called",
    "Aborted",
    "core dumped",
    "Fatal Python error",
    "Segmentation fault",
    "destroy_process_group() was not called",
)


def abort_lines(stderr: str) -> list[str]:
    """Lines of a run's stderr that show an abnormal teardown."""
    return [line for line in stderr.splitlines() if any(marker in line for marker in ABORT_MARKERS)]


def launch_env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "tests"), env.get("PYTHONPATH")]))
    return env


def launch_ddp_train(config: Path, overrides: list[str], timeout: float = 400, **env: str) -> None:
    """`framer-ds train config overrides` as DDP on 2 CPU processes (`--multi_gpu` over gloo); fails with
    the run's stderr if it exits non-zero. `timeout`: the whole launch, in seconds; `env`: added to the
    launch environment."""
    cmd = accelerate_launch_cmd(
        "--multi_gpu", "--num_processes", "2", "-m", "framer_ds", "train", str(config), *overrides
    )
    proc = subprocess.run(
        cmd, cwd=REPO, env={**launch_env(), **env}, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-5000:]


def start_process(cmd: list[str], **env: str) -> subprocess.Popen:
    """A real process in its own session (as Slurm runs a job step, so a test can signal all of it),
    with the launch environment and its output in pipes."""
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        env={**launch_env(), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for_step(run_dir: Path, step: int, proc, timeout: float = 240) -> None:
    """Until metrics.jsonl reaches `step`; fails with the run's stderr if it ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metrics = run_dir / "metrics.jsonl"
        if metrics.exists() and any(
            json.loads(line).get("step", 0) >= step
            for line in metrics.read_text().splitlines()
            if line.strip()
        ):
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early:\n{proc.communicate()[1][-4000:]}")
        time.sleep(0.2)
    raise AssertionError(f"step {step} not reached in {timeout} s")


def rank_processes(launcher) -> list:
    """The training processes a launcher started (python children running framer_ds), oldest first."""
    import psutil

    found = [
        p
        for p in psutil.Process(launcher.pid).children(recursive=True)
        if any("framer_ds" in part for part in p.cmdline())
    ]
    return sorted(found, key=lambda p: p.create_time())


def strategy_launch_args(strategy: str, json_dir: Path) -> list[str]:
    """accelerate launch flags for a strategy on 2 CPU processes."""
    if strategy == "ddp":
        return ["--multi_gpu", "--num_processes", "2"]
    if strategy == "single":
        return ["--num_processes", "1"]
    if strategy == "fsdp2":
        return ["--config_file", "configs/accelerate_fsdp2_cpu_2proc.yaml"]
    base = {
        "zero2": "zero2.json",
        "zero2_offload": "zero2_offload.json",
        "zero3": "zero3.json",
        "zero3_offload": "zero3_offload.json",
    }[strategy]
    # ZeRO-3 test settings that keep bugs visible: partition even tiny tensors, and release every
    # parameter right after use (the shipped 1e9 live/reuse budgets keep them gathered after a
    # forward, which hides e.g. an ungathered adapter save).
    extra = (
        {
            "stage3_param_persistence_threshold": 0,
            "stage3_max_live_parameters": 0,
            "stage3_max_reuse_distance": 0,
        }
        if base.startswith("zero3")
        else {}
    )
    path = write_deepspeed_json(base, json_dir / f"{strategy}.json", **extra)
    return ["--config_file", "configs/accelerate_cpu_2proc.yaml", "--deepspeed_config_file", str(path)]
