"""Run the 2-process ZeRO-3 tiny case N times and count unclean exits.

Why: a rank that leaves the interpreter with its process group still alive can abort in gloo's
destructor ("terminate called without an active exception", exit -6) after training succeeded. It
happens in a fraction of runs, so one green run proves nothing; this counts it over many.

    .venv/bin/python scripts/dev/exit_soak.py --runs 20            # from the repository root
    .venv/bin/python scripts/dev/exit_soak.py --runs 5 --trackers tensorboard

Prints one line per run and a summary; exits 1 when any run exited non-zero or printed abort text.
The launched case is the suite's (tests/framer_test_tasks.py: an MLP with a peft LoRA, ZeRO-3 with
every tensor partitioned), so the script needs the repository checkout, not only the package.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from conftest import abort_lines  # noqa: E402  (the suite's clean-exit test uses the same check)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _write_case(directory: Path, trackers: str, max_steps: int) -> tuple[Path, Path]:
    """The run config and the ZeRO-3 JSON of the tiny case."""
    deepspeed = json.loads((REPO / "configs" / "deepspeed" / "zero3.json").read_text())
    deepspeed["zero_optimization"].update(
        stage3_param_persistence_threshold=0, stage3_max_live_parameters=0, stage3_max_reuse_distance=0
    )
    ds_path = directory / "zero3.json"
    ds_path.write_text(json.dumps(deepspeed, indent=2))
    log: dict = {"tensorboard": trackers in ("tensorboard", "both")}
    if trackers in ("wandb", "both"):
        log["wandb"] = {"offline": True, "project": "exit_soak"}
    config = {
        "imports": ["framer_test_tasks"],
        "task": "test_mlp_regression",
        "output_dir": str(directory / "run"),
        "model": {"lora_rank": 4},
        "data": {},
        "log": log,
        "train": {
            "seed": 7,
            "length": {"steps": max_steps},
            "micro_batch_size": 8,
            "optimizer": {"learning_rate": 1e-2},
        },
    }
    config_path = directory / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    return config_path, ds_path


def run_once(directory: Path, trackers: str, max_steps: int, timeout_s: int) -> tuple[int, str]:
    config, deepspeed = _write_case(directory, trackers, max_steps)
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--main_process_port",
        str(_free_port()),
        "--config_file",
        str(REPO / "configs" / "accelerate_cpu_2proc.yaml"),
        "--deepspeed_config_file",
        str(deepspeed),
        "-m",
        "framer_ds",
        "train",
        str(config),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "tests"), env.get("PYTHONPATH")]))
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        return 124, f"timed out after {timeout_s} s\n{exc.stderr or ''}"
    return proc.returncode, proc.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--trackers", choices=["none", "tensorboard", "wandb", "both"], default="none")
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--timeout-s", type=int, default=600)
    parser.add_argument("--keep", type=Path, help="write each failing run's stderr here")
    args = parser.parse_args(argv)

    failures = 0
    started = time.perf_counter()
    for index in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory(prefix="exit_soak_") as tmp:
            t0 = time.perf_counter()
            code, stderr = run_once(Path(tmp), args.trackers, args.max_steps, args.timeout_s)
        aborts = abort_lines(stderr)
        clean = code == 0 and not aborts
        failures += not clean
        status = "clean" if clean else f"UNCLEAN exit={code} " + " | ".join(aborts[:3])
        print(f"run {index:3d}/{args.runs}: {time.perf_counter() - t0:6.1f} s  {status}", flush=True)
        if not clean and args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            (args.keep / f"run_{index}.stderr").write_text(stderr)
    total = time.perf_counter() - started
    print(
        f"{args.runs - failures}/{args.runs} clean, {failures} unclean "
        f"(trackers={args.trackers}, {total / 60:.1f} min)"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
