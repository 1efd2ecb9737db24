"""Measure a real training run: per-rank peak ALLOCATED memory after every optimizer step, and s/step.

Why one instrument: the planner's activation probe, `benchmarks/strategy_memory.py` and `framer-ds bench`
must read memory the same way, or their figures cannot be compared. Each rank runs `run_training` as
`framer-ds train` does; an optimizer-step hook reads the peak of every allocation so far - on a GPU
`torch.cuda.max_memory_allocated`, on a CPU the allocation counter preloaded into the process
(benchmarks/alloc_counter, a benchmark tool outside the package: every malloc-family allocation and
every mapping, safetensors files included; without it, the peak RSS) - and
the bytes allocated before training started (the imports) are subtracted. On a CPU the same counter also
keeps a tensors-only peak (tensor storage and mapped weight files), the figure that means what a GPU's
`max_memory_allocated` means and the one a prediction of device memory is compared with; the
whole-process figure beside it adds Python objects, gloo and DeepSpeed host structures and decoding.

This file also runs as a script (`python framer_ds/lab/measure.py CONFIG OUT_DIR`, under `accelerate
launch`): the worker imports only `load_run_config` and `run_training`, so a benchmark can point
PYTHONPATH at another checkout (the commit before a change) and keep this instrument.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

WORKER_SCRIPT = Path(__file__).resolve()


# --- the worker: one rank of one training run ----------------------------------------------------------


@dataclass(frozen=True)
class _Readers:
    """This process's memory figures: every allocation (`peak`, `live`, `reset`), tensors only (`tensor_*`:
    what a GPU's allocator counts) and the shared memory mapped now."""

    peak: Callable[[], int]
    live: Callable[[], int]
    reset: Callable[[], None]
    tensor_peak: Callable[[], int]
    tensor_live: Callable[[], int]
    tensor_reset: Callable[[], None]
    shared: Callable[[], int]


def _readers() -> _Readers:
    """On a GPU the CUDA allocator's figures (tensors only, so both pairs are the same); on a CPU the
    allocation counter's two pairs when a benchmark preloaded it (benchmarks/alloc_counter), else the
    process's peak RSS (`_rss_readers`)."""
    import torch

    if torch.cuda.is_available():
        cuda = torch.cuda
        return _Readers(
            cuda.max_memory_allocated,
            cuda.memory_allocated,
            cuda.reset_peak_memory_stats,
            cuda.max_memory_allocated,
            cuda.memory_allocated,
            lambda: None,  # reset_peak_memory_stats above resets the one peak both pairs read
            lambda: 0,
        )
    from framer_ds.lab.alloc_counter import counter_function, log_counter_peaks

    names = (
        "peak_bytes",
        "live_bytes",
        "reset_peak",
        "tensor_peak_bytes",
        "tensor_live_bytes",
        "tensor_reset_peak",
    )
    try:
        functions = [counter_function(name) for name in (*names, "shared_bytes")]
    except AttributeError:
        return _rss_readers()
    log_counter_peaks()  # the run's metrics lines carry the same peaks
    return _Readers(*functions)


def _rss_readers() -> _Readers:
    """A CPU process without the counter: its resident set, the peak from the kernel's high-water mark
    (VmHWM), reset by writing 5 to /proc/self/clear_refs (Linux). Touched pages only: a buffer allocated
    and filled lazily shows late or not at all, which is why the CPU benchmarks preload the counter. One
    figure, so both pairs read it (as on a GPU)."""
    import psutil

    process = psutil.Process()

    def peak() -> int:
        try:
            status = Path("/proc/self/status").read_text()
        except OSError:
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        kib = next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))
        return int(kib) * 1024

    def reset() -> None:
        with contextlib.suppress(OSError):  # no reset: the peak stays the run's, start-up included
            Path("/proc/self/clear_refs").write_text("5")

    def live() -> int:
        return process.memory_info().rss

    return _Readers(peak, live, reset, peak, live, lambda: None, lambda: 0)


def memory_instrument() -> str:
    """What a measured launch from this process reads memory with, in words (bench.md says it)."""
    import torch

    from framer_ds.lab.alloc_counter import COUNTER_ENV, counter_library

    if torch.cuda.is_available():
        return "torch.cuda.max_memory_allocated (tensor bytes)"
    if counter_library() is not None:
        return f"the allocation counter ({COUNTER_ENV}): tensor bytes, the whole process beside"
    return (
        f"peak RSS (touched pages only; set {COUNTER_ENV} to the allocation counter of "
        "benchmarks/alloc_counter for allocated tensor bytes)"
    )


def run_worker(config_path: Path, out_dir: Path, overrides: list[str]) -> None:
    """Train as `framer-ds train` does and write this rank's per-step (time, peak bytes, shared bytes,
    tensor peak bytes) to out_dir, with the bytes allocated before training starts (torch, accelerate,
    transformers, deepspeed) in both counts."""

    from torch.optim.optimizer import register_optimizer_step_post_hook

    from framer_ds.tasks.run_config import load_run_config
    from framer_ds.train.loop import run_training

    with contextlib.suppress(ImportError):
        import deepspeed  # noqa: F401  (imported by every strategy, so the baseline is the same)
    read = _readers()
    baseline, tensor_baseline = read.live(), read.tensor_live()
    steps: list[tuple[float, int, int, int]] = []

    def after_step(*_: object) -> None:
        steps.append((time.perf_counter(), read.peak(), read.shared(), read.tensor_peak()))
        if len(steps) == 1:  # from here on the peaks are the steady state: steps 2..N, start-up excluded
            read.reset()
            read.tensor_reset()

    rank = int(os.environ.get("RANK", "0"))
    profiler = _profiler(out_dir, rank) if os.environ.get(PROFILE_ENV) else None
    handle = register_optimizer_step_post_hook(after_step)
    if profiler is not None:
        profiler.start()
        profile_handle = register_optimizer_step_post_hook(lambda *_: profiler.step())
    run_training(load_run_config(config_path, overrides))
    handle.remove()
    record = {
        "rank": rank,
        "steps": steps,
        "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "baseline_bytes": baseline,
        "tensor_baseline_bytes": tensor_baseline,
    }
    if profiler is not None:
        profile_handle.remove()
        profiler.stop()
        from framer_ds.lab.profile_summary import step_breakdown

        record["profile_seconds"] = step_breakdown(profiler.events() or [])
    (out_dir / f"rank{rank}.json").write_text(json.dumps(record))


PROFILE_ENV = "FRAMER_DS_PROFILE"
"""Set (to 1) in a measured launch's environment: each rank also writes a Chrome trace of steps 3-5."""


def _profiler(out_dir: Path, rank: int):
    """PyTorch's profiler over three optimizer steps after two of warm-up, one Chrome trace per rank."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    return profile(
        activities=activities,
        schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=lambda prof: prof.export_chrome_trace(str(out_dir / f"trace_rank{rank}.json")),
    )


# --- the driver ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    """One run, largest rank. `run`: through the last step, start-up included; `steady`: steps 2..N."""

    run_bytes: int
    steady_bytes: int
    tensor_run_bytes: int
    tensor_steady_bytes: int
    """The same two, tensors only: what `torch.cuda.max_memory_allocated` means (on a GPU, equal to the
    two above; on a CPU, tensor storage and mapped weight files, without Python objects, gloo and
    DeepSpeed host structures or video decoding)."""
    peak_bytes: int
    """Including the imports (the other two are above them)."""
    shared_bytes: int
    rss_bytes: int
    s_per_step: float
    steps: int
    processes: int
    wall_s: float
    rank_bytes: tuple[int, ...] = ()
    """run_bytes of every rank, in rank order."""
    tensor_rank_bytes: tuple[int, ...] = ()
    """tensor_run_bytes of every rank, in rank order."""
    profile_seconds: dict[str, float] | None = None
    """Rank 0's profiled steps by category (lab/profile_summary.py), with FRAMER_DS_PROFILE set."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def describe_machine() -> str:
    """The "Machine:" line of a measurement: device, versions, when (UTC)."""
    import datetime as dt
    import platform

    import accelerate
    import torch

    try:
        import deepspeed

        deepspeed_version = f", deepspeed {deepspeed.__version__}"
    except ImportError:
        deepspeed_version = ""
    cpu = platform.processor() or platform.machine()
    device = (
        torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({cpu}, {os.cpu_count()} cores)"
    )
    return (
        f"{device}; torch {torch.__version__}, accelerate {accelerate.__version__}{deepspeed_version}, "
        f"Python {platform.python_version()}; {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC"
    )


def measurement_env(cache: Path, pythonpath: Path | None = None, env: dict[str, str] | None = None) -> dict:
    """The environment of a measured launch: one OpenMP thread per rank; on a CPU the allocation counter
    preloaded when `FRAMER_DS_ALLOC_COUNTER` (in `env`, else this process's) names it (nothing is built
    here: benchmarks/alloc_counter builds it)."""
    import torch

    from framer_ds.lab.alloc_counter import counter_library, preload_env

    out = {**(os.environ if env is None else env), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    out["FRAMER_DS_CACHE"] = str(cache)
    if pythonpath is not None:
        out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), out.get("PYTHONPATH", "")]))
    library = None if torch.cuda.is_available() else counter_library(out)
    return out if library is None else preload_env(library, out)


def accelerate_launch_command(launch_args: list[str], port: int, script: Path, args: list[str]) -> list[str]:
    """`python -m accelerate.commands.launch <launch_args> --main_process_port P script args...`: this
    interpreter's accelerate, whatever `accelerate` is first on PATH."""
    launch = [sys.executable, "-m", "accelerate.commands.launch", *launch_args]
    return [*launch, "--main_process_port", str(port), str(script), *args]


def measure_launch(
    config_path: Path,
    overrides: list[str],
    launch_args: list[str],
    work_dir: Path,
    env: dict[str, str],
    cwd: Path,
    port: int,
) -> Measurement:
    """Run the worker under `accelerate launch <launch_args>` and read every rank's record; a failed
    launch raises with the command and the end of its stderr."""
    work_dir.mkdir(parents=True, exist_ok=True)
    command = accelerate_launch_command(
        launch_args, port, WORKER_SCRIPT, [str(config_path), str(work_dir), *overrides]
    )
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"measured run failed ({shlex.join(command)}):\n{done.stderr[-4000:]}")
    records = sorted(work_dir.glob("rank*.json"), key=lambda p: int(p.stem.removeprefix("rank")))
    ranks = [json.loads(p.read_text()) for p in records]
    if not ranks or not ranks[0]["steps"]:
        raise RuntimeError(f"measured run recorded no optimizer step ({shlex.join(command)})")
    # steps[0] holds the peaks of start-up + step 1; steps[-1] those of steps 2..N (reset after step 1)
    stamps = [step[0] for step in ranks[0]["steps"]]
    timed = stamps[2:] if len(stamps) > 3 else stamps  # the first two steps warm up allocators and buffers
    rank_bytes = tuple(max(step[1] for step in r["steps"]) - r["baseline_bytes"] for r in ranks)
    tensor_rank_bytes = tuple(max(step[3] for step in r["steps"]) - r["tensor_baseline_bytes"] for r in ranks)
    return Measurement(
        run_bytes=max(rank_bytes),
        steady_bytes=max(r["steps"][-1][1] - r["baseline_bytes"] for r in ranks),
        tensor_run_bytes=max(tensor_rank_bytes),
        tensor_steady_bytes=max(r["steps"][-1][3] - r["tensor_baseline_bytes"] for r in ranks),
        peak_bytes=max(max(step[1] for step in r["steps"]) for r in ranks),
        shared_bytes=max(step[2] for r in ranks for step in r["steps"]),
        rss_bytes=max(r["max_rss_bytes"] for r in ranks),
        s_per_step=(timed[-1] - timed[0]) / max(len(timed) - 1, 1),
        steps=len(stamps),
        processes=len(ranks),
        wall_s=time.perf_counter() - started,
        rank_bytes=rank_bytes,
        tensor_rank_bytes=tensor_rank_bytes,
        profile_seconds=ranks[0].get("profile_seconds"),
    )


if __name__ == "__main__":
    run_worker(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])
