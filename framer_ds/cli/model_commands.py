"""The commands that use a trained model: `sample` and `export` (the task recorded in the export parses
their options and does the work) and `eval` (a finished run's export on its held-out data)."""

from __future__ import annotations

import argparse
import os
from contextlib import AbstractContextManager
from pathlib import Path

from framer_ds.cli.command import CliCommand


def _export_arguments(parser: argparse.ArgumentParser) -> None:
    """`sample` and `export` read an export; its recorded task parses the rest."""
    parser.add_argument("export_dir", type=Path, help="a run's final/ (or checkpoints/step_N/adapter/)")
    parser.add_argument(
        "task_options", nargs=argparse.REMAINDER, metavar="...", help="the options of the export's task"
    )


def _task_command(args: argparse.Namespace, command: str) -> int:
    """`framer-ds sample|export EXPORT_DIR [task options]`: the task recorded in the export supplies the
    options model (its fields become the flags) and does the work."""
    from framer_ds.cli.options import build_options_parser, parse_options
    from framer_ds.tasks.run_config import load_exported_task

    task = load_exported_task(args.export_dir)
    options_model = type(task).sample_options if command == "sample" else type(task).export_options
    if options_model is None:
        return _print(task.export_command(args.export_dir, None))
    parser = build_options_parser(
        options_model,
        prog=f"framer-ds {command} {args.export_dir}",
        description=f"{task.name}: {options_model.__doc__ or ''}".strip(),
    )
    options = parse_options(options_model, parser, args.task_options)
    run = task.sample if command == "sample" else task.export_command
    out = getattr(options, "out", None)
    if out is None:
        return _print(run(args.export_dir, options))
    with _reporting_full_disk(Path(out), command):
        return _print(run(args.export_dir, options))


def _reporting_full_disk(out: Path, command: str) -> AbstractContextManager[None]:
    """A full disk under `--out` is one line. The writers stage their files beside `out` (building_dir,
    atomic_file) and delete them on failure, so nothing partial stays and what was there is kept."""
    from framer_ds.storage.disk_space import reporting_full_disk

    fix = f"Free space there and run framer-ds {command} again"
    return reporting_full_disk(out, 0, None, kept="nothing partial was left there", fix=fix)


def _print(text: str) -> int:
    print(text)
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    return _task_command(args, "sample")


def cmd_export(args: argparse.Namespace) -> int:
    return _task_command(args, "export")


def _eval_arguments(evaluation: argparse.ArgumentParser) -> None:
    evaluation.add_argument("run_dir", type=Path, help="a finished run's output_dir")
    evaluation.add_argument("--export", choices=["final", "best"], default="final", help="which export")
    evaluation.add_argument("--max-batches", type=int, default=None, help="stop after N eval batches")


def cmd_eval(args: argparse.Namespace) -> int:
    import json

    from framer_ds.train.evaluate_export import eval_output_path, evaluate_run

    report = evaluate_run(args.run_dir, args.export, args.max_batches)
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(report["metrics"], indent=2))
        print(f"wrote {eval_output_path(args.run_dir, args.export)}")
    return 0


SAMPLE = CliCommand(
    "sample",
    help="generate from a trained model: the task that made it decides what (video, labels, ...)",
    description="Generate from an export (a run's final/, or a checkpoint's export such as "
    "step_N/adapter/). The task recorded in it decides the options: run "
    "`framer-ds sample RUN/final --help` to list them.",
    add_arguments=_export_arguments,
    run=cmd_sample,
)
EXPORT = CliCommand(
    "export",
    help="write another form of a trained model (e.g. a video_lora adapter merged into SVD)",
    description="Write another form of an export (a run's final/): the task recorded in it decides "
    "what; run `framer-ds export RUN/final --help` to list its options.",
    add_arguments=_export_arguments,
    run=cmd_export,
)
EVAL = CliCommand(
    "eval",
    help="evaluate a finished run's export on its held-out data (writes RUN/eval.json)",
    description="Evaluate RUN/final (or RUN/best) with the config recorded in it, on the run's own "
    "held-out data, exactly as training evaluates: vit_classification loss, accuracy and per-class "
    "accuracy; tts_lm loss, audio-token accuracy and the quality gates (WER, speaker similarity, "
    "end-of-speech rate of generated speech); drivable_vit IoU per class and mean; video_lora "
    "eval/loss (with model.interp_eval the interpolation metrics). Prints the metrics and writes "
    "RUN/eval.json (RUN/eval_best.json), with a per_class table where the task has classes. Under "
    "`accelerate launch --num_processes N -m framer_ds eval RUN` the held-out set is split between "
    "the processes and the numbers are those of one process.",
    add_arguments=_eval_arguments,
    run=cmd_eval,
)
