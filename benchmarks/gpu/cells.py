"""The GPU suite's measured trainings (steps 2, 4 and 5) and the plan's prediction beside each (step 6).

Why cells through `framer-ds bench`'s own `run_cell`: every figure is one real `accelerate launch` of
`framer-ds train` measured by framer_ds/lab/measure.py (peak allocated per rank after the imports, s/step
after two warm-up steps), exactly what `framer-ds bench` reports to users, so the suite checks the
numbers users see. The prediction is `framer-ds plan`'s for the config the run actually resolved
(`run/config.yaml`), strategy and process count (benchmarks/planner_accuracy.py's `predict`).

`--smoke` keeps every cell's code path at tiny sizes on a CPU (tiny SVD, 2-layer Llama, small ViT), and
runs only the cells marked `smoke`, so CI proves the suite works in a few minutes.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from assets import LLAMA_1B, LLAMA_SMOKE, full_size_svd, long_speech_rows, speech_tokenizer

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
GiB = 2**30
STEPS = 8  # measure.py times steps 3..N: two warm-up steps, then six timed
SMOKE_STEPS = 4


@dataclass(frozen=True)
class Cell:
    """One measured training: a config, its overrides, a strategy and a process count."""

    step: str
    name: str
    config: Path
    overrides: tuple[str, ...]
    strategy: str = "plain"  # plain | ddp | zero2 | zero3 | zero3_offload | ...
    processes: int = 1
    smoke: bool = False  # also run under --smoke
    reference: str = ""  # the recipe's own figure, printed beside the measurement


# --- step 2: video_lora at the real SVD UNet size -------------------------------------------------------

VIDEO_MODES: dict[str, tuple[str, tuple[str, ...]]] = {
    # name: (strategy, overrides)
    "plain": ("plain", ("train.gradient_checkpointing=false", "data.cache.enabled=false")),
    "gradient checkpointing": ("plain", ("train.gradient_checkpointing=true", "data.cache.enabled=false")),
    "checkpointing + latent cache": (
        "plain",
        ("train.gradient_checkpointing=true", "data.cache.enabled=true"),
    ),
    "ZeRO-2": ("zero2", ("train.gradient_checkpointing=true", "data.cache.enabled=false")),
    "ZeRO-3": ("zero3", ("train.gradient_checkpointing=true", "data.cache.enabled=false")),
    "ZeRO-3 offload": ("zero3_offload", ("train.gradient_checkpointing=true", "data.cache.enabled=false")),
}
VIDEO_SHAPES = {
    # name: (mode, frames, height, width, reference, modes measured)
    "interp 576x576x10": (
        "interpolation",
        10,
        576,
        576,
        "~40 GB on one GPU (original recipe)",
        (*VIDEO_MODES,),
    ),
    "i2v 320x512x14": ("image_to_video", 14, 320, 512, "", ("gradient checkpointing", "ZeRO-2", "ZeRO-3")),
}
SMOKE_VIDEO = {"plain"}  # the DeepSpeed paths are smoked by the tts_lm and drivable_vit cells


def video_cells(work: Path, smoke: bool) -> list[Cell]:
    base = (
        ("model.source.builtin=tiny_svd",)
        if smoke
        else ("model.source.builtin=null", f"model.source.path={full_size_svd(work)}")
    )
    cells = []
    for shape, (mode, frames, height, width, reference, modes) in VIDEO_SHAPES.items():
        size = (4, 64, 64) if smoke else (frames, height, width)
        data = (f"data.num_frames={size[0]}", f"data.height={size[1]}", f"data.width={size[2]}")
        for name in modes:
            strategy, overrides = VIDEO_MODES[name]
            cells.append(
                Cell(
                    "video_lora",
                    f"{shape} / {name}",
                    CONFIGS / "tasks/video_lora/tiny.yaml",
                    (
                        *base,
                        f"model.base.mode={mode}",
                        *data,
                        "data.stride=1",
                        "model.samples.every=0",
                        f"data.cache.dir={work / 'latent_cache'}",
                        "train.micro_batch_size=1",
                        f"train.mixed_precision={'no' if smoke else 'bf16'}",
                        "model.lora.rank=64",
                        "model.lora.alpha=64",
                        *overrides,
                    ),
                    strategy,
                    smoke=name in SMOKE_VIDEO and shape.startswith("interp"),
                    reference=reference if name == "plain" else "",
                )
            )
    return cells


# --- step 4: tts_lm with a ~1B Llama at 8192 tokens ----------------------------------------------------


def tts_cells(work: Path, smoke: bool) -> list[Cell]:
    seq = 512 if smoke else 8192
    llama = LLAMA_SMOKE if smoke else LLAMA_1B
    rows = long_speech_rows(work, rows=24 if smoke else 64, max_tokens=seq)
    model = [f"model.source.config.{key}={value}" for key, value in llama.items()]
    common = (
        "model.source.builtin=null",
        *model,
        f"model.source.config.max_position_embeddings={seq}",
        f"model.tokenizer={speech_tokenizer()}",
        "model.samples.every=0",
        "data.source.builtin=null",
        f"data.source.path={rows}",
        "data.eval=null",
        "data.val_fraction=0.1",
        "data.format=codes",
        "data.speaker_column=null",
        "data.speaker_prefix=false",
        f"data.max_seq_length={seq}",
        "train.micro_batch_size=2",
        "train.gradient_accumulation_steps=1",
        f"train.mixed_precision={'no' if smoke else 'bf16'}",
        "train.gradient_checkpointing=true",
    )
    layouts = {
        "pack": ("data.length_policy=pack",),
        "pad": ("data.length_policy=filter", "data.group_by_length=false"),
    }
    cells = []
    for strategy in ("zero3_offload", "zero2"):
        for layout, overrides in layouts.items():
            cells.append(
                Cell(
                    "tts_lm",
                    f"1B Llama seq {seq} / {strategy} / {layout}",
                    CONFIGS / "tasks/tts_lm/tiny.yaml",
                    (*common, *overrides),
                    strategy,
                    smoke=strategy == "zero2",
                    reference="~10 GB at batch 2 (recipe table)" if strategy == "zero3_offload" else "",
                )
            )
    return cells


# --- step 5: drivable_vit with the 16-GPU model settings -----------------------------------------------


def drivable_cells(work: Path, smoke: bool) -> list[Cell]:
    config = CONFIGS / "tasks/drivable_vit" / ("tiny.yaml" if smoke else "zero3_16gpu.yaml")
    overrides: tuple[str, ...] = ("train.micro_batch_size=2", "train.gradient_accumulation_steps=1")
    if not smoke:  # the original model on generated roads (resized to 256 px): memory follows the shapes
        overrides += ("data.source.path=null", "data.source.builtin=synthetic_roads")
    return [
        Cell(
            "drivable_vit",
            "16-GPU model, micro-batch 2 / ZeRO-3" + ("" if smoke else " fp16"),
            config,
            overrides,
            "zero3",
            smoke=True,
            reference="16 GB GPUs in the original setup",
        )
    ]


CELLS: dict[str, Callable[[Path, bool], list[Cell]]] = {
    "video_lora": video_cells,
    "tts_lm": tts_cells,
    "drivable_vit": drivable_cells,
}


# --- measuring one cell ---------------------------------------------------------------------------------


def steps_for(smoke: bool) -> int:
    return SMOKE_STEPS if smoke else STEPS


def measure_cell(cell: Cell, out_dir: Path, port: int, steps: int) -> dict[str, Any]:
    """One JSON record: the measured peak (GiB, largest rank), s/step, samples/s (and tokens/s for a
    token-counting task), the plan's prediction and its error, or `ok: false` with the ranks' error."""
    import torch
    from planner_accuracy import predict

    from framer_ds.lab.bench import run_cell
    from framer_ds.lab.report import read_history

    overrides = [*cell.overrides, "train.eval.max_batches=1", "train.log_every=1"]
    row = run_cell(
        cell.config,
        overrides,
        cell.strategy,
        cell.processes,
        steps,
        out_dir,
        CONFIGS / "deepspeed",
        profile=False,
        port=port,
        cwd=REPO,
    )
    record: dict[str, Any] = {"step": cell.step, "name": cell.name, "strategy": cell.strategy, "ok": row.ok}
    if cell.reference:
        record["reference"] = cell.reference
    if not row.ok:
        return {**record, "error": row.error}
    run = out_dir / f"{cell.strategy}_n{cell.processes}" / "run"
    history = read_history(run)
    timed = history.train[2:] or history.train
    record.update(
        peak_gib=row.peak_mib * 2**20 / GiB,
        s_per_step=row.s_per_step,
        samples_per_s=row.samples_per_s,
        wall_s=row.wall_s,
    )
    if timed and "tokens_per_s" in timed[0]:
        record["tokens_per_s"] = statistics.median(line["tokens_per_s"] for line in timed)
    try:
        predicted = predict(run / "config.yaml", cell.strategy, cell.processes) / GiB
    except Exception as exc:  # a planner failure is a finding for the table, not the end of the step
        record["plan_error_text"] = f"{type(exc).__name__}: {exc}"[:300]
    else:
        record["predicted_gib"] = predicted
        record["plan_error"] = (predicted - record["peak_gib"]) / record["peak_gib"]
    record["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return record
