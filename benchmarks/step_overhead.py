"""Time per optimizer step: framer_ds's `run_training` vs a minimal hand-written accelerate loop.

Why: framer_ds wraps the canonical accelerate loop in bookkeeping (loss window, non-finite checks,
metrics.jsonl, tqdm, resume counters). On the quickstart's tiny ViT on CPU a step takes ~20 ms, so
any per-step Python overhead shows; this checks that it stays within 5%. The method is written into
the report (see `report`): one process, same model/data/batch/seed/threads, runs alternating so
machine noise hits both, and ONE clock for both sides (torch's global optimizer post-step hook), so
neither side's own timer is trusted and start-up, eval and export are never timed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import itertools
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import accelerate
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import set_seed
from report import write_section
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader
from transformers import ViTConfig, ViTForImageClassification, get_scheduler

from framer_ds.tasks.run_config import load_run_config
from framer_ds.tasks.vit_classification.task import VitClassificationTask
from framer_ds.train.loop import run_training
from framer_ds.train.schedule import plan_steps

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "quickstart.yaml"
TARGET_RATIO = 1.05
WARMUP_STEPS = 20
NUM_LABELS = 10  # the digits dataset
SECTION = "## step_overhead"


class StepClock:
    """Timestamps every optimizer step in the process; the same instrument times both loops."""

    def __init__(self) -> None:
        self.stamps: list[tuple[float, float]] = []  # (wall, process CPU) seconds

    def __enter__(self) -> StepClock:
        self._handle = register_optimizer_step_post_hook(self._hook)
        return self

    def _hook(self, *_: object) -> None:
        self.stamps.append((time.perf_counter(), time.process_time()))

    def __exit__(self, *exc: object) -> None:
        self._handle.remove()

    def steady_state(self) -> Times:
        """Per-step (wall, CPU) seconds for steps WARMUP_STEPS+1 .. N, each a hook-to-hook interval."""
        kept = self.stamps[WARMUP_STEPS - 1 :]
        pairs = list(itertools.pairwise(kept))
        return Times([b[0] - a[0] for a, b in pairs], [b[1] - a[1] for a, b in pairs])


@dataclass
class Times:
    wall: list[float]
    cpu: list[float]


@dataclass
class Repeat:
    baseline: Times
    framer: Times
    framer_jsonl: list[float]
    load: float  # 1-minute load average after the pair: > cores means other processes competed

    @property
    def ratio(self) -> float:
        return statistics.median(self.framer.wall) / statistics.median(self.baseline.wall)

    @property
    def cpu_ratio(self) -> float:
        return statistics.median(self.framer.cpu) / statistics.median(self.baseline.cpu)


def reset_accelerate() -> None:
    """Accelerator state is a process-wide singleton; each in-process run must start clean."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    gc.collect()


def overrides(steps: int, out: Path) -> list[str]:
    """No eval or checkpoint inside the timed steps (the final eval and export come after them)."""
    no_extras = ["train.eval.every=null", "train.checkpoint.every=null"]
    return [f"output_dir={out}", f"train.length.steps={steps}", *no_extras]


def run_framer(steps: int, out: Path) -> tuple[Times, list[float]]:
    """framer_ds exactly as users run it (default log_every=1, tqdm on); returns (clock, jsonl) times."""
    config = load_run_config(CONFIG, overrides(steps, out))
    with StepClock() as clock:
        run_training(config)
    reset_accelerate()
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    global_batch = config.train.global_batch_size(1)
    jsonl = [global_batch / x["samples_per_s"] for x in lines if "samples_per_s" in x]
    return clock.steady_state(), jsonl[WARMUP_STEPS:]


def run_baseline(steps: int, out: Path) -> Times:
    """The canonical accelerate loop on the same model, data (same Dataset class), batch and seed."""
    config = load_run_config(CONFIG, overrides(steps, out))
    train = config.train
    # framer_ds trains on the GPU when there is one; the baseline must use the same device.
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    set_seed(train.seed)
    task = VitClassificationTask(config)
    task.prepare_data()
    train_set, _ = task.build_datasets()
    model = ViTForImageClassification(ViTConfig(**config.model.source.config, num_labels=NUM_LABELS))
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=train.optimizer.learning_rate,
        betas=(train.optimizer.beta1, train.optimizer.beta2),
        eps=train.optimizer.epsilon,
        weight_decay=train.optimizer.weight_decay,
    )
    scheduler = get_scheduler(
        train.lr_schedule.name,
        optimizer,
        num_warmup_steps=plan_steps(len(train_set), train, 1).warmup_steps,
        num_training_steps=steps,
    )
    loader = DataLoader(train_set, batch_size=train.micro_batch_size, shuffle=True, drop_last=True)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    model.train()
    losses: list[float] = []
    with StepClock() as clock:
        while len(losses) < steps:
            for batch in loader:
                with accelerator.accumulate(model):
                    loss = model(**batch).loss
                    accelerator.backward(loss)
                    if accelerator.sync_gradients:
                        accelerator.clip_grad_norm_(model.parameters(), train.optimizer.max_grad_norm)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad()
                losses.append(loss.item())
                if len(losses) >= steps:
                    break
    reset_accelerate()
    return clock.steady_state()


def machine() -> str:
    info = Path("/proc/cpuinfo")
    names = [x for x in info.read_text().splitlines() if x.startswith("model name")] if info.exists() else []
    cpu = names[0].split(":", 1)[1].strip() if names else "unknown CPU"
    return (
        f"{cpu}, {os.cpu_count()} cores; torch {torch.__version__}, accelerate {accelerate.__version__}, "
        f"Python {sys.version.split()[0]}; {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC"
    )


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:.2f}"


def report(repeats: list[Repeat], args: argparse.Namespace, command: str, batch: int) -> str:
    """Markdown section (also printed): method, machine, per-repeat table, verdict."""
    ratio = statistics.median(r.ratio for r in repeats)
    cpu_ratio = statistics.median(r.cpu_ratio for r in repeats)
    # This benchmark itself keeps up to `threads` cores busy; well above the core count means others ran.
    busy = [i for i, r in enumerate(repeats, 1) if r.load > (os.cpu_count() or 1) + 1]
    rows = "\n".join(
        f"| {i} | {ms(r.baseline.wall)} | {ms(r.framer.wall)} | {ms(r.framer_jsonl)} | {r.ratio:.3f} | "
        f"{r.cpu_ratio:.3f} | {r.load:.1f} |"
        for i, r in enumerate(repeats, 1)
    )
    noise = (
        f"\nWarning: load average above cores + 1 after repeat(s) {busy}: other processes "
        "competed for the CPU, so those timings carry their noise (the CPU-time ratio is less affected).\n"
        if busy
        else ""
    )
    verdict = "PASS" if ratio <= TARGET_RATIO else "FAIL"
    return f"""{SECTION}

Written by `benchmarks/step_overhead.py`. Command: `{command}`

Machine: {machine()}; torch threads: {args.threads}.

Time per optimizer step of `run_training(configs/quickstart.yaml)` (default log_every=1, tqdm on)
vs a minimal accelerate loop (`accumulate`, `backward`, `clip_grad_norm_`, `step`, scheduler,
`zero_grad`, `loss.item()`): same model, data, batch size ({batch}), seed and threads, one process.
Both are timed by one clock, torch's global optimizer post-step hook: each interval is one full
iteration; start-up, eval and export are excluded. Steps 1-{WARMUP_STEPS} of {args.steps} are dropped; runs
alternate baseline/framer_ds {args.repeats} times. Cells are per-run medians; the ratio is framer_ds/baseline
in wall time (process CPU time as a cross-check). metrics.jsonl = framer_ds's own `samples_per_s`
timer, which leaves out writing the line itself. Load = 1-minute load average after the pair.

| repeat | baseline ms/step | framer_ds ms/step | metrics.jsonl ms/step | ratio (wall) | ratio (CPU) | load |
|---|---|---|---|---|---|---|
{rows}
{noise}
Median ratio (wall): **{ratio:.3f}**, target <= {TARGET_RATIO}: **{verdict}**
(CPU-time ratio {cpu_ratio:.3f}).
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150, help="optimizer steps per run")
    parser.add_argument("--repeats", type=int, default=5, help="alternating baseline/framer_ds pairs")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads for both sides")
    parser.add_argument("--write", type=Path, help="markdown file whose step_overhead section to replace")
    args = parser.parse_args(argv)
    if args.steps <= WARMUP_STEPS + 10:
        parser.error(f"--steps must exceed {WARMUP_STEPS + 10} (the first {WARMUP_STEPS} are warm-up)")
    argv = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "benchmarks/step_overhead.py", *argv])
    torch.set_num_threads(args.threads)
    repeats: list[Repeat] = []
    with tempfile.TemporaryDirectory(prefix="step_overhead_") as tmp:
        for i in range(args.repeats):
            baseline = run_baseline(args.steps, Path(tmp) / f"baseline_{i}")
            framer, jsonl = run_framer(args.steps, Path(tmp) / f"framer_{i}")
            if torch.get_num_threads() != args.threads:
                raise RuntimeError(f"something changed torch threads to {torch.get_num_threads()}")
            repeats.append(Repeat(baseline, framer, jsonl, os.getloadavg()[0]))
            print(
                f"repeat {i + 1}: baseline {ms(baseline.wall)} ms, framer_ds {ms(framer.wall)} ms, "
                f"ratio {repeats[-1].ratio:.3f}",
                file=sys.stderr,
            )
    batch = load_run_config(CONFIG).train.micro_batch_size
    section = report(repeats, args, command, batch)
    print(section)
    if args.write is not None:
        write_section(args.write, SECTION, section)
    return 0  # the verdict is in the report; a slow machine must not break `make bench`


if __name__ == "__main__":
    raise SystemExit(main())
