"""`framer-ds eval RUN`: the evaluation of a finished run's export (`final/` or `best/`), on the run's own
held-out data, with the config recorded in the export, so the numbers are those training would log.

Every rank builds the data and the model as training does (`tasks.assemble`), loads the export's
weights before `prepare`, and runs the same `evaluate` (per-sample values summed over the eval set and
all ranks), so `accelerate launch --num_processes N -m framer_ds eval RUN` gives the same metrics as one
process. Rank 0 writes `RUN/eval.json` (or `RUN/eval_best.json`): the `eval/*` metrics and the task's
`eval_details` (e.g. `per_class`), all formed from the same totals.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader, Dataset

from framer_ds.config.errors import ConfigError, ConfigProblem
from framer_ds.engine.accelerator import build_accelerator, end_accelerator
from framer_ds.storage.atomic import atomic_write_json
from framer_ds.storage.disk_space import reporting_full_disk
from framer_ds.tasks.assemble import assemble
from framer_ds.tasks.run_config import load_exported_task
from framer_ds.train.evaluate import evaluate_totals


def eval_output_path(run_dir: Path, which: str) -> Path:
    return Path(run_dir) / ("eval.json" if which == "final" else f"eval_{which}.json")


def _write_report(path: Path, report: dict[str, Any]) -> None:
    """eval.json, atomically: on a full disk one line, and an earlier report stays as it was."""
    kept = f"the earlier {path.name} is kept" if path.exists() else f"no {path.name} was written"
    fix = "Free space there and run framer-ds eval again"
    with reporting_full_disk(path.parent, 0, None, kept=kept, fix=fix):
        atomic_write_json(path, report)


def _check_held_out(export_dir: Path, eval_set: Dataset | None) -> None:
    if eval_set is None or len(eval_set) == 0:
        problem = ConfigProblem(str(export_dir), "the run has no held-out data to evaluate on")
        raise ConfigError([problem], "eval")


def evaluate_run(run_dir: Path, which: str = "final", max_batches: int | None = None) -> dict[str, Any]:
    """Evaluate `run_dir/<which>/` on every rank; returns (and on rank 0 writes) the report."""
    export_dir = Path(run_dir) / which
    if not export_dir.is_dir():
        problem = ConfigProblem(str(export_dir), f"no {which}/ here: pass a finished run's directory")
        raise ConfigError([problem], "eval")
    task = load_exported_task(export_dir)
    config = task.config
    accelerator = build_accelerator(config, collective_timeout_s=config.train.collective_timeout_s)
    failed = True
    try:
        if accelerator.state.deepspeed_plugin is not None:
            problem = ConfigProblem(
                "launch",
                "framer-ds eval runs without DeepSpeed; launch it with plain `accelerate launch "
                "--num_processes N` (the export is a gathered adapter, it needs no ZeRO sharding)",
            )
            raise ConfigError([problem], "eval")
        parts = assemble(task, accelerator, lambda _, eval_set: _check_held_out(export_dir, eval_set))
        eval_set = parts.eval_set
        # The export's form may differ from the training model's (a merged LoRA): the task says
        # which model holds its weights.
        model = task.load_export(parts.model, export_dir)
        loader = DataLoader(
            eval_set,
            shuffle=False,
            batch_size=config.train.micro_batch_size,
            collate_fn=task.collate_fn(),
            num_workers=config.train.num_workers,
        )
        model, loader = accelerator.prepare(model, loader)
        started = time.perf_counter()
        sums, num_samples = evaluate_totals(accelerator, task, model, loader, max_batches=max_batches)
        metrics = task.summarize_eval(sums, num_samples) if sums else {}
        metrics.update(task.generation_metrics(accelerator, model, in_training=False))
        report = {
            "export": str(export_dir),
            "task": task.name,
            "processes": accelerator.num_processes,
            "eval_examples": len(eval_set),
            "evaluated_examples": num_samples,
            "seconds": round(time.perf_counter() - started, 3),
            "metrics": metrics,
            **(task.eval_details(sums, num_samples) if sums else {}),
        }
        if accelerator.is_main_process:
            _write_report(eval_output_path(run_dir, which), report)
        accelerator.wait_for_everyone()
        failed = False
        return report
    finally:
        end_accelerator(accelerator, failed=failed)
