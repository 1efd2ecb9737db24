"""The strategy lab's commands: `plan` (will it fit), `bench` (measured) and `report` (curves from runs).

Kept apart from main.py so each file stays one job: main.py wires every command, this one parses and
prints the lab's; the work is in framer_ds.lab."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from framer_ds.cli.command import CliCommand
from framer_ds.cli.options import add_config_args
from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.lab.memory_model import STRATEGIES


def _plan_arguments(plan: argparse.ArgumentParser) -> None:
    add_config_args(plan)
    plan.add_argument("--gpus", type=int, required=True, help="GPUs per node")
    plan.add_argument("--gpu-memory", required=True, help="memory of one GPU, e.g. 40GB, 80GiB (GB = GiB)")
    plan.add_argument("--nodes", type=int, default=1, help="machines (default 1)")
    plan.add_argument("--cpu-memory", help="host memory per node, e.g. 512GB: checked for the offloads")
    plan.add_argument(
        "--global-batch",
        type=int,
        help="samples per optimizer step to keep (default: the config's at N GPUs)",
    )
    plan.add_argument(
        "--deepspeed-dir",
        type=Path,
        default=Path("configs/deepspeed"),
        help="where the strategies' JSONs are (default configs/deepspeed)",
    )
    plan.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    plan.add_argument(
        "--remeasure",
        action="store_true",
        help="measure the census and activations again instead of reading them from the plan cache "
        "($FRAMER_DS_CACHE/plan), and replace the cached entry",
    )


def _bench_arguments(bench: argparse.ArgumentParser) -> None:
    add_config_args(bench)
    bench.add_argument(
        "--strategies", default="ddp,zero2,zero3", help="comma-separated, of " + ", ".join(STRATEGIES)
    )
    bench.add_argument("--nproc", default="1,2", help="process counts, comma-separated (default 1,2)")
    bench.add_argument(
        "--steps", type=int, default=8, help="optimizer steps per run (default 8; >= 5 with --profile)"
    )
    bench.add_argument("--output", type=Path, help="where to write (default runs/bench/<config name>)")
    bench.add_argument(
        "--deepspeed-dir", type=Path, default=Path("configs/deepspeed"), help="the strategies' JSONs"
    )
    bench.add_argument(
        "--compile",
        action="store_true",
        help="run every cell eager and with train.compile=true: step time, step 1 and compile time",
    )
    bench.add_argument(
        "--profile",
        action="store_true",
        help="PyTorch profiler traces of steps 3-5 per run (Chrome trace JSON) and where the time goes",
    )


def _report_arguments(report: argparse.ArgumentParser) -> None:
    report.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="output_dir of a run, or a log")
    report.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where to write (default RUN_DIR/report; several runs: report/ in the folder holding them)",
    )


def cmd_plan(args: argparse.Namespace) -> int:
    import json

    from framer_ds.lab.hardware import Hardware
    from framer_ds.lab.plan_text import format_plan, parse_bytes
    from framer_ds.lab.planner import make_plan

    problems = [
        ConfigProblem(flag, f"must be at least 1, got {value}")
        for flag, value in (
            ("--gpus", args.gpus),
            ("--nodes", args.nodes),
            ("--global-batch", args.global_batch),
        )
        if value is not None and value < 1
    ]
    sizes = {}
    for flag, text in (("--gpu-memory", args.gpu_memory), ("--cpu-memory", args.cpu_memory)):
        try:
            sizes[flag] = parse_bytes(text) if text is not None else None
        except ValueError as exc:
            problems.append(ConfigProblem(flag, str(exc)))
    if problems:
        raise ConfigError(problems, "plan")
    hardware = Hardware(args.gpus, args.nodes, sizes["--gpu-memory"], sizes["--cpu-memory"])
    if hardware.problems():
        raise ConfigError([ConfigProblem("--gpu-memory", text) for text in hardware.problems()], "plan")
    plan = make_plan(
        args.config,
        args.overrides,
        hardware,
        args.deepspeed_dir,
        global_batch=args.global_batch,
        remeasure=args.remeasure,
    )
    print(json.dumps(plan.as_dict(), indent=2) if args.json else format_plan(plan))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import shlex

    from framer_ds.lab.bench import markdown, parse_bench_request, run_bench

    strategies, counts = parse_bench_request(
        args.strategies, args.nproc, args.steps, args.profile, args.deepspeed_dir
    )
    out = args.output or Path("runs/bench") / args.config.stem
    command = shlex.join(["framer-ds", "bench", *sys.argv[2:]]) if sys.argv[1:2] == ["bench"] else ""
    rows, files = run_bench(
        args.config, args.overrides, strategies, counts, args.steps, out, args.deepspeed_dir, args.profile,
        command=command, compile_too=args.compile,
    )  # fmt: skip
    print(markdown(rows))
    print(f"wrote {', '.join(str(f) for f in files)}")
    return 0 if any(r.ok for r in rows) else 1


def cmd_report(args: argparse.Namespace) -> int:
    from framer_ds.lab.report import write_report

    report = write_report(args.runs, args.out)
    print(report.read_text().split("\n\n")[1])
    print(f"wrote {report} and its plots")
    return 0


PLAN = CliCommand(
    "plan",
    help="which strategy fits on N GPUs, the largest micro-batch and the launch command (no weights)",
    description="Count the parameters (meta device, no weight file read), measure the activations "
    "(one forward + backward of the real model on fake tensors, at micro-batch 1 and 2, with gradient "
    "checkpointing as configured and on; a stack of identical blocks at 2 and 3 blocks, extended exactly "
    "to its depth; both cached per config, files and framer_ds version under $FRAMER_DS_CACHE/plan, so "
    "planning the same config again takes seconds), and add up every strategy's per-GPU memory with the "
    "DeepSpeed JSONs' buffers. Prints which strategies fit, the largest micro-batch of each, the "
    "accumulation for the global batch and the fastest strategy that fits, with its launch command.",
    add_arguments=_plan_arguments,
    run=cmd_plan,
)
BENCH = CliCommand(
    "bench",
    help="short real trainings of a config per strategy and process count: memory, speed, loss, plots",
    description="Train CONFIG for --steps optimizer steps under each strategy and process count, each "
    "its own `accelerate launch`, measured alike (peak allocated memory per rank after every step, "
    "s/step after two warm-up steps). Writes bench.json, bench.csv, bench.md and PNG plots (memory, "
    "throughput, step time, scaling efficiency) to --output, and logs them to W&B when the config "
    "does. A strategy that cannot run here becomes a row with its reason.",
    add_arguments=_bench_arguments,
    run=cmd_bench,
)
REPORT = CliCommand(
    "report",
    help="PNG curves and a markdown table from run directories (metrics.jsonl, or a job's logs/*.out)",
    description="Overlay the runs' loss, eval metrics, learning rate, throughput and memory over steps "
    "(one PNG each, one legend entry per run) and write report.md with a summary table: steps, time, "
    "samples/s, peak memory, final loss, final and best eval values. A run without metrics.jsonl is "
    "read from its Slurm log (RUN_DIR/logs/*.out, or the .out file itself).",
    add_arguments=_report_arguments,
    run=cmd_report,
)
LAB_COMMANDS = (PLAN, BENCH, REPORT)
