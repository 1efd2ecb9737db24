"""`framer-ds` subcommands. Config problems print as a list and exit 1; crashes still exit non-zero."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from framer_ds.config.errors import ConfigError, ConfigProblem, InputDataError


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", type=Path, help="training YAML (see configs/)")
    parser.add_argument(
        "overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. train.max_steps=20"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="framer-ds",
        description="Fine-tune video-diffusion LoRAs, ViTs and TTS LMs with Accelerate + DeepSpeed.",
        epilog="Distributed: accelerate launch --config_file configs/accelerate_4gpu.yaml "
        "-m framer_ds train CONFIG",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = sub.add_parser("train", help="train a task from a YAML config")
    _add_config_args(train)
    train.add_argument(
        "--overwrite", action="store_true", help="start over in an output_dir that already holds a run"
    )

    validate = sub.add_parser(
        "validate", help="check a training YAML (and launch configs) without loading weights or data"
    )
    _add_config_args(validate)
    validate.add_argument("--accelerate-config", type=Path, help="accelerate YAML to cross-check")
    validate.add_argument("--deepspeed-config", type=Path, help="DeepSpeed JSON to cross-check")

    data = sub.add_parser("data", help="dataset tools")
    data_sub = data.add_subparsers(dest="data_command", required=True, metavar="DATA_COMMAND")
    check = data_sub.add_parser("check", help="validate a config's dataset before launch and print a report")
    _add_config_args(check)

    sample = sub.add_parser(
        "sample", help="write a video from a video_lora adapter and conditioning frame(s)"
    )
    sample.add_argument(
        "adapter", type=Path, help="a video_lora run's final/ (or checkpoints/step_N/adapter/)"
    )
    sample.add_argument("--image", type=Path, required=True, help="first frame")
    sample.add_argument("--last-image", type=Path, help="last frame (interpolation adapters)")
    sample.add_argument("--out", type=Path, required=True, help="output .mp4")
    sample.add_argument("--steps", type=int, default=25, help="Euler steps")
    sample.add_argument("--seed", type=int, default=0)
    sample.add_argument(
        "--fps", type=float, help="fps conditioning and output rate (default: trained value or 7)"
    )
    sample.add_argument("--device", default="cuda" if _has_cuda() else "cpu")

    sub.add_parser("tasks", help="list registered tasks")
    return parser


def cmd_train(args: argparse.Namespace) -> int:
    from framer_ds.config.loader import load_run_config
    from framer_ds.train.faults import EXIT_PREEMPTED, NonFiniteLossError, Preempted
    from framer_ds.train.loop import run_training

    overrides = list(args.overrides) + (["overwrite_output_dir=true"] if args.overwrite else [])
    config = load_run_config(args.config, overrides)
    try:
        result = run_training(config)
    except Preempted as stop:
        print(f"{stop}; resume with train.resume=latest (exit {EXIT_PREEMPTED})", file=sys.stderr)
        return EXIT_PREEMPTED
    except NonFiniteLossError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if int(os.environ.get("RANK", "0")) == 0:
        summary = ", ".join(f"{k}={v:.4f}" for k, v in sorted(result.eval_metrics.items()))
        print(f"done: {result.global_step} steps, {summary or 'no eval set'}; outputs in {result.output_dir}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from framer_ds.config.launch_check import check_launch_configs
    from framer_ds.config.loader import load_run_config
    from framer_ds.tasks.registry import get_task_class

    config = load_run_config(args.config, args.overrides)
    task = get_task_class(config.task)(config)
    problems = task.check() + check_launch_configs(
        config.train,
        accelerate_config=args.accelerate_config,
        deepspeed_config=args.deepspeed_config,
        model_has_hidden_size=task.model_has_hidden_size,
    )
    if problems:
        raise ConfigError(problems, str(args.config))
    checked = [str(p) for p in (args.config, args.accelerate_config, args.deepspeed_config) if p is not None]
    print(f"OK: {', '.join(checked)} valid (task {config.task}, output_dir {config.output_dir})")
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from framer_ds.config.loader import load_run_config
    from framer_ds.tasks.registry import get_task_class

    config = load_run_config(args.config, args.overrides)
    task = get_task_class(config.task)(config)
    problems = task.check()
    if problems:
        raise ConfigError(problems, str(args.config))
    task.prepare_data()
    print(task.data_report())
    return 0


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def cmd_sample(args: argparse.Namespace) -> int:
    import torch

    from framer_ds.data.video_write import to_uint8_frames, write_video
    from framer_ds.diffusion.sampling import SamplerParts, sample_video
    from framer_ds.tasks.video_lora.inference import load_frame, load_pipeline_with_adapter

    dtype = torch.float16 if args.device.startswith("cuda") else torch.float32
    pipe, meta = load_pipeline_with_adapter(args.adapter, args.device, dtype)
    if (meta["mode"] == "interpolation") != (args.last_image is not None):
        raise ConfigError(
            [
                ConfigProblem(
                    "--last-image",
                    f"this is a {meta['mode']} adapter: --last-image is "
                    + ("required" if meta["mode"] == "interpolation" else "not used"),
                )
            ]
        )
    size = (meta["height"], meta["width"])
    first = load_frame(args.image, *size, args.device)
    last = load_frame(args.last_image, *size, args.device) if args.last_image else None
    fps = args.fps or meta.get("fps") or 7
    generator = torch.Generator(device=args.device).manual_seed(args.seed)
    frames = sample_video(
        SamplerParts.from_pipeline(pipe),
        first,
        last,
        meta["num_frames"],
        fps,
        meta["motion_bucket_id"],
        num_inference_steps=args.steps,
        generator=generator,
    )
    pixels = to_uint8_frames(frames)
    write_video(args.out, pixels, fps)
    print(f"wrote {args.out}: {len(pixels)} frames at {size[1]}x{size[0]}, {fps} fps")
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    from framer_ds.tasks.registry import available_tasks

    tasks = available_tasks()
    width = max(map(len, tasks), default=0)
    for name, summary in tasks.items():
        print(f"{name:<{width}}  {summary}")
    return 0


COMMANDS = {
    "train": cmd_train,
    "validate": cmd_validate,
    "data": cmd_data,
    "sample": cmd_sample,
    "tasks": cmd_tasks,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # Options may sit between overrides (`train CFG a=1 --overwrite b=2`); argparse's nargs="*" stops
    # at the first option, so the remaining key=value items arrive as "unknown" and are taken here.
    args, extra = parser.parse_known_args(argv)
    stray = [item for item in extra if item.startswith("-") or "=" not in item]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    try:
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        print(f"error: {exc.render()}", file=sys.stderr)
        return 1
    except InputDataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
