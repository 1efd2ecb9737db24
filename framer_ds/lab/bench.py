"""`framer-ds bench`: the same config trained for a few steps under each strategy and process count,
measured the same way (lab/measure.py), into one table, files and plots.

Why short real runs and not a model: the comparison our users ran by hand (DDP vs ZeRO stages vs
offload, 1 vs N processes: memory, step time, throughput, loss) is only trusted when every cell ran the
same code path as training. Each cell is its own `accelerate launch` (its own process group); a cell that
fails - ZeRO++'s quantization kernels on a machine without CUDA, an out-of-memory - becomes a row with
its reason, and the others still run.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.lab.bench_plots import plot_bench
from framer_ds.lab.bench_rows import BenchRow
from framer_ds.lab.measure import (
    PROFILE_ENV,
    describe_machine,
    measure_launch,
    measurement_env,
    memory_instrument,
)
from framer_ds.lab.memory_model import STRATEGIES
from framer_ds.lab.profile_summary import format_breakdown, hta_breakdown
from framer_ds.lab.report import read_history
from framer_ds.storage.locations import default_cache_dir

MiB = 2**20
RUN_OVERRIDES = (
    "train.checkpoint.every=null",
    "train.eval.every=null",  # evaluated once, at the end: the final eval metric of the row
    "log.wandb=null",  # the bench logs one summary run, not one run per cell
)


def launch_args(
    strategy: str, processes: int, deepspeed_dir: Path, gpu: bool, accelerate_dir: Path = Path("configs")
) -> list[str]:
    """`accelerate launch` flags for one cell: DDP (one process: plain), FSDP2 on its accelerate YAML, or
    DeepSpeed with the strategy's JSON on a DeepSpeed accelerate YAML from `accelerate_dir` (its
    num_processes overridden); "plain" is one process without DDP."""
    if strategy in ("plain", "ddp"):
        return (["--multi_gpu"] if strategy == "ddp" and processes > 1 else []) + [
            "--num_processes",
            str(processes),
        ]
    if strategy == "fsdp2":
        return ["--config_file", str(accelerate_dir / fsdp2_yaml(gpu)), "--num_processes", str(processes)]
    return [
        "--config_file", str(accelerate_dir / deepspeed_yaml(gpu)), "--num_processes", str(processes),
        "--deepspeed_config_file", str(deepspeed_dir / f"{strategy}.json"),
    ]  # fmt: skip


def deepspeed_yaml(gpu: bool) -> str:
    return "accelerate_8gpu.yaml" if gpu else "accelerate_cpu_2proc.yaml"


def fsdp2_yaml(gpu: bool) -> str:
    return "accelerate_fsdp2_8gpu.yaml" if gpu else "accelerate_fsdp2_cpu_2proc.yaml"


def parse_bench_request(
    strategies_text: str, nproc_text: str, steps: int, profile: bool, deepspeed_dir: Path
) -> tuple[list[str], list[int]]:
    """The strategies and process counts `framer-ds bench` was given, or a ConfigError with every
    problem: unknown strategies, bad counts, too few steps, missing JSONs or accelerate YAML."""
    import torch

    strategies = [s for s in strategies_text.split(",") if s]
    problems = [
        ConfigProblem("--strategies", f"unknown strategy {s!r}; choose from {', '.join(STRATEGIES)}")
        for s in strategies
        if s not in STRATEGIES
    ]
    try:
        counts = [int(n) for n in nproc_text.split(",") if n]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        problems.append(ConfigProblem("--nproc", f"{nproc_text!r}: give process counts, e.g. 1,2"))
    if steps < (5 if profile else 3):
        problems.append(
            ConfigProblem("--steps", "at least 3 (5 with --profile): two warm-up steps come first")
        )
    deepspeed = [s for s in strategies if s in STRATEGIES and s not in ("ddp", "fsdp2")]
    gpu = torch.cuda.is_available()
    for needed, base in ((deepspeed, deepspeed_yaml(gpu)), ("fsdp2" in strategies, fsdp2_yaml(gpu))):
        if needed and not (Path("configs") / base).is_file():
            problems.append(ConfigProblem("bench", f"configs/{base} not found: run from the repository root"))
    if "fsdp2" in strategies and 1 in counts:
        problems.append(ConfigProblem("--nproc", "fsdp2 needs 2+ processes (one process shards nothing)"))
    problems += [
        ConfigProblem("--deepspeed-dir", f"{deepspeed_dir / (s + '.json')} not found")
        for s in deepspeed
        if not (deepspeed_dir / f"{s}.json").is_file()
    ]
    if problems:
        raise ConfigError(problems, "bench")
    return strategies, counts


EXCEPTION_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?(?P<text>[\w.]*(?:Error|Exception): .+)$")
LAUNCHER_ERRORS = ("ChildFailedError", "CalledProcessError")


def failure_reason(error: str) -> str:
    """The exception a failed launch's ranks raised (not the launcher's own "child failed"), else the
    last line of its stderr."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    raised = [m["text"] for line in lines if (m := EXCEPTION_LINE.match(line))]
    raised = [
        text for text in raised if not text.startswith(LAUNCHER_ERRORS) and "ChildFailedError" not in text
    ]
    return (raised or lines or ["failed"])[-1][:300]


COMPILED = "+compile"
"""The suffix of a `--compile` row's strategy: its cell ran with train.compile=true."""


def run_cell(
    config: Path,
    overrides: list[str],
    strategy: str,
    processes: int,
    steps: int,
    out_dir: Path,
    deepspeed_dir: Path,
    profile: bool,
    port: int,
    cwd: Path,
) -> BenchRow:
    """One launch; a `strategy` ending in COMPILED runs its base strategy with train.compile=true."""
    import torch

    gpu = torch.cuda.is_available()
    compiled = strategy.endswith(COMPILED)
    cell = out_dir / f"{strategy.replace(COMPILED, '_compile')}_n{processes}"
    shutil.rmtree(cell, ignore_errors=True)  # a cell run again starts clean (its worker records, its run)
    run_overrides = [*overrides, *RUN_OVERRIDES, f"train.length.steps={steps}", f"output_dir={cell / 'run'}"]
    run_overrides += ["train.compile=true"] if compiled else []
    strategy_label, strategy = strategy, strategy.removesuffix(COMPILED)
    env = measurement_env(default_cache_dir())
    if profile:
        env[PROFILE_ENV] = "1"
    args = launch_args(strategy, processes, deepspeed_dir, gpu)
    try:
        found = measure_launch(config, run_overrides, args, cell, env, cwd, port)
    except RuntimeError as exc:
        reason = failure_reason(str(exc))
        if strategy == "zeropp" and not gpu:
            reason = f"ZeRO++ quantizes with CUDA kernels, this machine has no GPU ({reason})"
        return BenchRow(strategy_label, processes, ok=False, error=reason)
    history = read_history(cell / "run")
    global_batch = history.summary.get("global batch")
    last_eval = history.evals[-1] if history.evals else {}
    first_rate = history.train[0].get("samples_per_s") if history.train else None
    return BenchRow(
        strategy_label,
        processes,
        ok=True,
        peak_mib_per_rank=[b / MiB for b in found.tensor_rank_bytes],
        process_mib_per_rank=[b / MiB for b in found.rank_bytes],
        s_per_step=found.s_per_step,
        samples_per_s=global_batch / found.s_per_step if global_batch and found.s_per_step else None,
        final_loss=history.train[-1]["loss"] if history.train else None,
        eval={k: v for k, v in last_eval.items() if k.startswith("eval/")},
        wall_s=found.wall_s,
        profile=found.profile_seconds,
        hta=hta_breakdown(cell) if profile and gpu else None,
        traces=[str(p) for p in sorted(cell.glob("trace_rank*.json"))],
        first_step_s=global_batch / first_rate if global_batch and first_rate else None,
    )


def add_compile_times(rows: list[BenchRow]) -> None:
    """Each compiled row's compile time: its step 1 minus the eager twin's step 1 (both warm up alike;
    the difference is dynamo's tracing and inductor's code generation)."""
    eager = {(r.strategy, r.processes): r.first_step_s for r in rows}
    for row in rows:
        base = eager.get((row.strategy.removesuffix(COMPILED), row.processes))
        if row.strategy.endswith(COMPILED) and row.first_step_s is not None and base is not None:
            row.compile_s = row.first_step_s - base


def scaling_efficiency(rows: list[BenchRow]) -> dict[tuple[str, int], float]:
    """Throughput at N processes over N/n0 x the throughput at the fewest processes n0, per strategy."""
    out = {}
    for strategy in dict.fromkeys(r.strategy for r in rows):
        measured = sorted(
            (r.processes, r.samples_per_s) for r in rows if r.strategy == strategy and r.samples_per_s
        )
        if len(measured) < 2:
            continue
        n0, base = measured[0]
        for n, rate in measured:
            out[strategy, n] = rate / (base * n / n0)
    return out


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown(rows: list[BenchRow]) -> str:
    """The table; a "process MiB/rank" column only where it differs from the tensor peak (on a CPU)."""
    efficiency = scaling_efficiency(rows)
    eval_names = sorted({k for r in rows for k in r.eval})
    host = any(r.process_mib_per_rank and r.process_mib_per_rank != r.peak_mib_per_rank for r in rows)
    timed = any(r.strategy.endswith(COMPILED) for r in rows)  # `--compile`: step 1 and compile time
    head = ["strategy", "processes", "peak MiB/rank (max)", *(["process MiB/rank"] if host else []), "s/step",
            *(["step 1 s", "compile s"] if timed else []), "samples/s", "scaling", "final loss"]  # fmt: skip
    lines = [
        "| " + " | ".join([*head, *eval_names, "wall s", "note"]) + " |",
        "|" + "---|" * (len(head) + len(eval_names) + 2),
    ]
    for r in rows:
        scaling = efficiency.get((r.strategy, r.processes))
        note = r.error if not r.ok else (format_breakdown(r.profile) if r.profile else "")
        cells = [
            r.strategy, str(r.processes), _number(r.peak_mib, ".0f"),
            *([_number(r.process_mib, ".0f")] if host else []), _number(r.s_per_step, ".3f"),
            *([_number(r.first_step_s, ".2f"), _number(r.compile_s, ".1f")] if timed else []),
            _number(r.samples_per_s, ".3g"), "-" if scaling is None else f"{scaling:.0%}",
            _number(r.final_loss, ".4f"), *[_number(r.eval.get(n), ".4f") for n in eval_names],
            _number(r.wall_s, ".0f"), note.replace("|", "/"),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_bench_files(rows: list[BenchRow], out_dir: Path, header: dict[str, Any]) -> list[Path]:
    """bench.json (everything), bench.csv (one line per cell), bench.md (the table) and the plots."""
    efficiency = scaling_efficiency(rows)
    records = [
        {
            **asdict(r),
            "peak_mib": r.peak_mib,
            "process_mib": r.process_mib,
            "scaling_efficiency": efficiency.get((r.strategy, r.processes)),
        }
        for r in rows
    ]
    (out_dir / "bench.json").write_text(json.dumps({**header, "cells": records}, indent=2))
    columns = ["strategy", "processes", "ok", "peak_mib", "process_mib", "s_per_step", "first_step_s",
               "compile_s", "samples_per_s", "scaling_efficiency", "final_loss", "wall_s",
               "error"]  # fmt: skip
    with (out_dir / "bench.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(records)
    command = f"Command: `{header['command']}`\n\nMachine: {header['machine']}\n\n"
    if header.get("memory"):
        command += f"Memory: {header['memory']}\n\n"
    plots = plot_bench(rows, efficiency, out_dir)
    images = "\n\n".join(f"![{p.stem}]({p.name})" for p in plots)
    (out_dir / "bench.md").write_text(
        f"# framer-ds bench: {header['config']}\n\n{command}{markdown(rows)}\n\n{images}\n"
    )
    return [out_dir / "bench.json", out_dir / "bench.csv", out_dir / "bench.md", *plots]


def log_to_wandb(
    config_path: Path, overrides: list[str], rows: list[BenchRow], files: list[Path], out_dir: Path
) -> bool:
    """One W&B run holding the table and the plots, when the config logs to W&B."""
    from framer_ds.compat import require
    from framer_ds.tasks.run_config import load_run_config

    wandb_config = load_run_config(config_path, overrides).log.wandb
    if wandb_config is None:
        return False
    wandb = require("wandb", "logging the bench to W&B (log.wandb)")
    run = wandb.init(
        project=wandb_config.project,
        entity=wandb_config.entity,
        name=f"bench {config_path.stem}",
        mode="offline" if wandb_config.offline else "online",
        dir=str(out_dir),
        job_type="bench",
    )
    table = wandb.Table(columns=["strategy", "processes", "peak_mib", "s_per_step", "samples_per_s", "error"])
    for r in rows:
        table.add_data(r.strategy, r.processes, r.peak_mib, r.s_per_step, r.samples_per_s, r.error)
    run.log({"bench": table, **{p.stem: wandb.Image(str(p)) for p in files if p.suffix == ".png"}})
    run.finish()
    return True


def run_bench(
    config: Path,
    overrides: list[str],
    strategies: list[str],
    processes: list[int],
    steps: int,
    out_dir: Path,
    deepspeed_dir: Path,
    profile: bool = False,
    port: int = 29620,
    cwd: Path | None = None,
    command: str = "",
    compile_too: bool = False,
) -> tuple[list[BenchRow], list[Path]]:
    """Every strategy at every process count; with `compile_too` each also with train.compile=true (a
    `<strategy>+compile` row: eager vs compiled step time and the compile time)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    instrument = memory_instrument()
    print(f"memory measured with {instrument}", flush=True)
    rows = []
    cells = [v for s in strategies for v in ([s, s + COMPILED] if compile_too else [s])]
    for strategy in cells:
        for n in processes:
            row = run_cell(
                config,
                overrides,
                strategy,
                n,
                steps,
                out_dir,
                deepspeed_dir,
                profile,
                port,
                cwd or Path.cwd(),
            )
            port += 1
            rows.append(row)
            status = (
                f"peak {row.peak_mib:.0f} MiB/rank, {row.s_per_step:.3f} s/step"
                if row.ok
                else f"failed: {row.error}"
            )
            print(f"{strategy} x{n}: {status}", flush=True)
    add_compile_times(rows)
    header = {
        "config": str(config),
        "overrides": overrides,
        "command": command,
        "machine": describe_machine(),
        "memory": instrument,
        "steps": steps,
    }
    files = write_bench_files(rows, out_dir, header)
    if log_to_wandb(config, overrides, rows, files, out_dir):
        print("logged the table and plots to W&B")
    return rows, files
