"""`framer-ds report`: curves and a summary table from finished (or running, or killed) runs.

Why from files: a comparison study's runs live on a cluster's disk after their jobs ended; W&B may have
been off or offline. Every run directory has metrics.jsonl (flushed line by line, so a killed job's is
complete up to its last log line); a job that died before writing it still has its Slurm log
(`logs/*.out`), whose progress bar and eval lines the loop prints, so that is read instead.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.storage.atomic import atomic_write_text

# tqdm's bar in a log file: "train:  25%|##5  | 10/40 [00:05<00:15,  2.00it/s, loss=8.9261]"
PROGRESS = re.compile(
    r"(?P<step>\d+)/(?P<total>\d+) \[(?P<elapsed>(?:\d+:)?\d+:\d+)<[^,\]]*"
    r"(?:,\s*(?P<rate>[0-9.]+)(?P<unit>it/s|s/it))?(?:,\s*(?P<postfix>[^\]]*))?\]"
)
EVAL_LINE = re.compile(r"^step (?P<step>\d+): (?P<values>\S+=.*)$")  # "step 20: eval/loss=1.2345, ..."
PAIR = re.compile(r"(?P<key>[\w/.-]+)=(?P<value>[-+0-9.eE]+|nan|inf)")
# Peak memory, in order of preference: a GPU's allocator; on a CPU the tensors-only counter (what a GPU
# would count, benchmarks/alloc_counter/alloc_counter.c, when preloaded); else the whole process.
MEMORY_KEYS = ("memory/max_allocated_gb", "memory/max_tensor_allocated_gb", "memory/rss_gb")


@dataclass
class RunHistory:
    """What one run logged: training lines, eval lines and its run summary, from either source."""

    name: str
    source: Path
    train: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    def eval_names(self) -> list[str]:
        return sorted({key for line in self.evals for key in line if key.startswith("eval/")})


def read_history(path: Path) -> RunHistory:
    """A run directory (its metrics.jsonl, else its logs/*.out) or a log file."""
    path = Path(path)
    if path.is_dir() and (path / "metrics.jsonl").is_file():
        return _from_metrics(path.name, path / "metrics.jsonl")
    logs = sorted((path / "logs").glob("*.out")) if path.is_dir() else [path] if path.is_file() else []
    if path.is_dir() and not logs:
        logs = sorted(path.glob("*.out"))
    if not logs:
        raise ConfigError(
            [
                ConfigProblem(
                    str(path), "no metrics.jsonl, no logs/*.out: give a run's output_dir or a job log"
                )
            ]
        )
    history = RunHistory(path.name if path.is_dir() else path.stem, logs[-1])
    for log in logs:  # a requeued job's logs, oldest first: later steps replace earlier ones
        _read_text_log(log, history)
    return history


def _from_metrics(name: str, path: Path) -> RunHistory:
    history = RunHistory(name, path)
    raw_lines = path.read_text().splitlines()
    for number, raw in enumerate(raw_lines, 1):
        try:
            line = json.loads(raw)
        except ValueError:
            if number == len(raw_lines):
                break  # the last line of a killed job may be cut off
            raise ConfigError([ConfigProblem(f"{path}:{number}", "not JSON; the file is damaged")]) from None
        if "run_summary" in line:
            history.summary = line["run_summary"]
        elif "loss" in line:
            history.train.append(line)
        elif any(key.startswith("eval/") for key in line):
            history.evals.append(line)
    return history


def _seconds(clock: str) -> float:
    return sum(float(part) * 60**i for i, part in enumerate(reversed(clock.split(":"))))


def _read_text_log(path: Path, history: RunHistory) -> None:
    """Training lines from the bar's prints: a later print of a step (the bar's last one at close, a
    requeued job's resumed steps) replaces the earlier ones, as the latest is the current one."""
    for chunk in re.split(r"[\r\n]+", path.read_text(errors="replace")):
        evaluated = EVAL_LINE.match(chunk.strip())
        if evaluated:
            values = {m["key"]: float(m["value"]) for m in PAIR.finditer(evaluated["values"])}
            history.evals.append({"step": int(evaluated["step"]), **values})
            continue
        progress = PROGRESS.search(chunk) if chunk.lstrip().startswith("train:") else None
        if progress is None:
            continue
        step = int(progress["step"])
        values = {m["key"]: float(m["value"]) for m in PAIR.finditer(progress["postfix"] or "")}
        if "loss" not in values:
            continue
        line: dict[str, Any] = {"step": step, "elapsed_s": _seconds(progress["elapsed"]), **values}
        if progress["rate"]:
            rate = float(progress["rate"])
            line["steps_per_s"] = rate if progress["unit"] == "it/s" else 1 / max(rate, 1e-12)
        history.train = [x for x in history.train if x["step"] < step] + [line]


def train_seconds(history: RunHistory) -> float | None:
    """Wall time from the first to the last training line: metrics.jsonl's clock, the bar's elapsed
    time, or (older files) the samples logged divided by their rate."""
    lines = history.train
    if not lines:
        return None
    if "time" in lines[0]:
        return lines[-1]["time"] - lines[0]["time"]
    if "elapsed_s" in lines[-1]:
        return lines[-1]["elapsed_s"]
    previous, total = 0.0, 0.0
    for line in lines:
        if line.get("samples_per_s"):
            total += (line["samples"] - previous) / line["samples_per_s"]
        previous = line.get("samples", previous)
    return total or None


def summary_row(history: RunHistory) -> dict[str, Any]:
    """The table's row: steps, time, throughput, peak memory, final loss, final and best eval values."""
    train = history.train
    rates = [x["samples_per_s"] for x in train if "samples_per_s" in x]
    memory = next((values for key in MEMORY_KEYS if (values := [x[key] for x in train if key in x])), [])
    row: dict[str, Any] = {
        "run": history.name,
        "strategy": history.summary.get("strategy", ""),
        "steps": train[-1]["step"] if train else 0,
        "time_s": train_seconds(history),
        "samples_per_s": sum(rates[len(rates) // 2 :]) / len(rates[len(rates) // 2 :]) if rates else None,
        "peak_memory_gb": max(memory) if memory else None,
        "final_loss": train[-1]["loss"] if train else None,
    }
    for name in history.eval_names():
        values = [x[name] for x in history.evals if name in x and math.isfinite(x[name])]
        if values:
            lower_is_better = "loss" in name
            row[f"final {name}"] = values[-1]
            row[f"best {name}"] = min(values) if lower_is_better else max(values)
    return row


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def markdown_table(histories: list[RunHistory]) -> str:
    rows = [summary_row(h) for h in histories]
    columns = list(dict.fromkeys(key for row in rows for key in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def _series(history: RunHistory, key: str) -> tuple[list[float], list[float]]:
    source = history.evals if key.startswith("eval/") else history.train
    points = [(x["step"], x[key]) for x in source if isinstance(x.get(key), (int, float))]
    return [p[0] for p in points], [p[1] for p in points]


def plot_histories(histories: list[RunHistory], out_dir: Path) -> list[Path]:
    """One PNG per quantity any run logged (loss, eval metrics, LR, throughput, memory), runs overlaid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    quantities = ["loss", "lr", "samples_per_s", *MEMORY_KEYS]
    quantities += sorted({name for h in histories for name in h.eval_names()})
    written = []
    for key in quantities:
        curves = [(h.name, *_series(h, key)) for h in histories]
        curves = [c for c in curves if c[1]]
        if not curves:
            continue
        figure, axes = plt.subplots(figsize=(7, 4), dpi=100)
        for name, steps, values in curves:
            axes.plot(steps, values, marker="o" if len(steps) < 20 else None, markersize=3, label=name)
        axes.set_xlabel("optimizer step")
        axes.set_ylabel(key)
        axes.set_title(key)
        axes.grid(alpha=0.3)
        axes.legend()
        figure.tight_layout()
        path = out_dir / f"{key.replace('/', '_')}.png"
        figure.savefig(path)
        plt.close(figure)
        written.append(path)
    return written


def run_directory(path: Path) -> Path:
    """The run a `framer-ds report` argument names: a directory itself; a job log `RUN/logs/x.out` its
    RUN (a bare log file: its folder)."""
    path = Path(path)
    if path.is_dir():
        return path
    return path.parent.parent if path.parent.name == "logs" else path.parent


def default_report_dir(paths: list[Path]) -> Path:
    """Where a report goes without --out: with its run (`RUN/report/`), so it travels with the run's
    other outputs and never lands in whatever directory the command ran from; several runs compared:
    `report/` in the folder that holds them all."""
    runs = [run_directory(p).resolve() for p in paths]
    return (runs[0] if len(runs) == 1 else Path(os.path.commonpath(runs))) / "report"


def write_report(paths: list[Path], out_dir: Path | None = None) -> Path:
    """report.md (the table, then the plots) and the PNGs, in out_dir (default `default_report_dir`)."""
    out_dir = Path(out_dir) if out_dir is not None else default_report_dir(paths)
    histories = [read_history(p) for p in paths]
    names = [h.name for h in histories]
    for index, history in enumerate(histories):  # two runs called "final" or "run" stay apart
        if names.count(history.name) > 1:
            history.name = f"{history.name} ({history.source.parent.parent.name or index})"
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = plot_histories(histories, out_dir)
    sources = "\n".join(f"- {h.name}: {h.source}" for h in histories)
    text = "\n\n".join(
        [
            "# Training report",
            markdown_table(histories),
            "Sources:\n" + sources,
            *[f"![{p.stem}]({p.name})" for p in plots],
        ]
    )
    report = out_dir / "report.md"
    atomic_write_text(report, text + "\n")
    return report
