"""The baseline of the overhead step: the canonical accelerate loop on framer_ds's model, data and batch.

Run under `accelerate launch` with the same flags as the framer_ds cell it is compared with:
`hand_loop.py CONFIG OUT_DIR [key=value ...]`. It reads the same Dataset class through the task (so
image decoding and resizing cost the same) and builds the model with the task's own `build_model` (the
same ViT, with gradient checkpointing when configured): only the loop is hand-written. It times optimizer
steps with the clock framer_ds's measurement uses (torch's global optimizer post-step hook) and writes
`hand_loop_rank<R>.json` with the step timestamps.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main(config_path: Path, out_dir: Path, overrides: list[str]) -> None:
    import torch
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils.data import DataLoader

    from framer_ds.tasks.run_config import load_run_config
    from framer_ds.tasks.vit_classification.task import VitClassificationTask

    config = load_run_config(config_path, overrides)
    train = config.train
    gpu = torch.cuda.is_available()
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false") == "true"
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    # On a CPU, several ranks need gloo named and DDP needs cpu=True (docs/architecture.md), as in framer_ds.
    accelerator = Accelerator(
        cpu=not gpu and not deepspeed,
        mixed_precision=train.mixed_precision,
        kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")] if distributed and not gpu else [],
    )
    task = VitClassificationTask(config)
    with accelerator.main_process_first():
        task.prepare_data()
    train_set, _ = task.build_datasets()
    model = task.build_model()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=train.optimizer.learning_rate, weight_decay=train.optimizer.weight_decay
    )
    loader = DataLoader(
        train_set,
        batch_size=train.micro_batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=train.num_workers,
        collate_fn=task.collate_fn(),
    )
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    stamps: list[float] = []
    handle = register_optimizer_step_post_hook(lambda *_: stamps.append(time.perf_counter()))
    model.train()
    while len(stamps) < train.length.steps:
        for batch in loader:
            loss = model(pixel_values=batch["pixel_values"], labels=batch["labels"]).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if len(stamps) >= train.length.steps:
                break
    handle.remove()
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {"stamps": stamps, "micro_batch": train.micro_batch_size, "processes": accelerator.num_processes}
    (out_dir / f"hand_loop_rank{accelerator.process_index}.json").write_text(json.dumps(record))
    accelerator.end_training()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])
