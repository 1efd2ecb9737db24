"""Plain and DDP runs under bf16 store the frozen base in bf16, as DeepSpeed does, and keep the trainable
parameters (LoRA) fp32: the frozen weights cost 2 bytes each, not 4 plus autocast's bf16 copy, which is
what the planner counts. A bf16 run with that base resumes exactly (2 steps + resume == 4 straight:
the same process, the same casts, restored fp32 LoRA weights and Adam states), and exports only the LoRA.
"""

from __future__ import annotations

import torch

from conftest import mlp_config, read_metrics, reset_accelerate, train_in_process
from framer_ds.engine.accelerator import build_accelerator
from framer_ds.lab.census import census_of
from framer_ds.lab.memory_model import estimate
from framer_ds.tasks.registry import get_task_class
from framer_ds.tasks.run_config import load_run_config
from framer_ds.train.run import build_training_run

SECTIONS = {"model": {"lora_rank": 4}, "train": {"mixed_precision": "bf16", "length.steps": 4}}


def test_the_frozen_base_is_stored_bf16_and_the_lora_fp32(tmp_path):
    config = load_run_config(mlp_config(tmp_path / "c.yaml", tmp_path / "run", **SECTIONS), [])
    accelerator = build_accelerator(config, collective_timeout_s=60)
    run = build_training_run(accelerator, get_task_class(config.task)(config), config)
    dtypes = {name: p.dtype for name, p in run.model.named_parameters()}
    reset_accelerate()
    frozen = {n: d for n, d in dtypes.items() if "lora_" not in n}
    trainable = {n: d for n, d in dtypes.items() if "lora_" in n}
    assert frozen and set(frozen.values()) == {torch.bfloat16}, frozen
    assert trainable and set(trainable.values()) == {torch.float32}, trainable
    # the planner's DDP row counts those frozen weights at 2 bytes each
    census = census_of(run.model)
    terms = estimate("ddp", census, 1, "bf16", 0).by_name()
    assert terms["frozen weights"] == 2 * census.frozen


def test_a_bf16_run_with_a_bf16_base_resumes_exactly(tmp_path):
    straight = mlp_config(tmp_path / "s.yaml", tmp_path / "straight", **SECTIONS)
    train_in_process(straight)
    sections = {**SECTIONS, "train": {**SECTIONS["train"], "checkpoint.every.steps": 2}}
    resumed = mlp_config(tmp_path / "r.yaml", tmp_path / "resumed", **sections)
    train_in_process(resumed, ["train.length.steps=2"])
    train_in_process(resumed, ["train.resume=latest"])
    expected = [line["loss"] for line in read_metrics(tmp_path / "straight")[0]]
    assert len(expected) == 4 and [line["loss"] for line in read_metrics(tmp_path / "resumed")[0]] == expected
    from safetensors.torch import load_file

    adapter = load_file(tmp_path / "straight" / "final" / "adapter_model.safetensors")
    assert adapter and all("lora_" in name and t.dtype == torch.float32 for name, t in adapter.items())
