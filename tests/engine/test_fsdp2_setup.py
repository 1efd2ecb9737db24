"""FSDP2 set-up without processes: the CPU selection, the wrap classes a task names, the default hook.
The 2-process behaviour (sharding, losses, resume, exports) is tests/engine/test_fsdp2.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

from conftest import REPO
from framer_ds.engine.fsdp2 import local_shard, select_fsdp2_on_cpu, set_wrap_classes


@pytest.fixture
def shared_state(monkeypatch):
    """accelerate's process-wide state dicts, replaced for the test (the selection writes them)."""
    monkeypatch.setattr(PartialState, "_shared_state", {})
    monkeypatch.setattr(AcceleratorState, "_shared_state", {})


def fake_accelerator(distributed_type: DistributedType, mixed_precision: str) -> SimpleNamespace:
    state = SimpleNamespace(
        distributed_type=distributed_type, mixed_precision=mixed_precision, fsdp_plugin=None
    )
    return SimpleNamespace(state=state)


def test_cpu_processes_get_fsdp2_with_the_training_yaml_precision(shared_state):
    """accelerate leaves a CPU launch MULTI_CPU (DDP) with the FSDP plugin dropped; the selection turns
    it into FSDP with the plugin, and train.mixed_precision becomes its MixedPrecisionPolicy."""
    accelerator = fake_accelerator(DistributedType.MULTI_CPU, "bf16")
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    select_fsdp2_on_cpu(accelerator, plugin)
    assert accelerator.state.distributed_type == DistributedType.FSDP
    assert accelerator.state.fsdp_plugin is plugin
    assert PartialState._shared_state["distributed_type"] == DistributedType.FSDP
    assert plugin.mixed_precision_policy.param_dtype == torch.bfloat16
    fp32 = FullyShardedDataParallelPlugin(fsdp_version=2)
    select_fsdp2_on_cpu(fake_accelerator(DistributedType.MULTI_CPU, "no"), fp32)
    assert fp32.mixed_precision_policy is None  # fp32 training: no cast at all


def test_anything_but_multi_cpu_is_an_internal_error(shared_state):
    with pytest.raises(RuntimeError, match="expects a MULTI_CPU state"):
        select_fsdp2_on_cpu(
            fake_accelerator(DistributedType.NO, "no"), FullyShardedDataParallelPlugin(fsdp_version=2)
        )


def test_wrap_classes_come_from_the_task_unless_the_yaml_names_them():
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin))
    set_wrap_classes(accelerator, ["ViTLayer"])
    assert plugin.transformer_cls_names_to_wrap == ["ViTLayer"]
    named = FullyShardedDataParallelPlugin(fsdp_version=2, transformer_cls_names_to_wrap=["Block"])
    set_wrap_classes(SimpleNamespace(state=SimpleNamespace(fsdp_plugin=named)), ["ViTLayer"])
    assert named.transformer_cls_names_to_wrap == ["Block"]
    set_wrap_classes(SimpleNamespace(state=SimpleNamespace()), ["ViTLayer"])  # DDP: no plugin, nothing to do


def test_default_block_hook_leaves_out_the_block_around_the_input_embedding():
    """transformers' ViT lists ViTEmbeddings and ViTLayer as unsplittable; accelerate shards the input
    embedding (ViTPatchEmbeddings, inside ViTEmbeddings) as a unit of its own, so wrapping ViTEmbeddings
    too made fully_shard meet already-sharded DTensors and fail at prepare."""
    from transformers import ViTConfig, ViTForImageClassification

    from framer_ds.tasks.base import Task

    config = ViTConfig(image_size=8, patch_size=4, hidden_size=16, num_hidden_layers=2, num_attention_heads=2)
    model = ViTForImageClassification(config)
    assert set(model._no_split_modules) == {"ViTEmbeddings", "ViTLayer"}
    assert Task.fsdp_block_classes(None, model) == ["ViTLayer"]  # type: ignore[arg-type]
    assert Task.fsdp_block_classes(None, torch.nn.Linear(2, 2)) == []  # type: ignore[arg-type]


def test_local_shard_of_a_plain_tensor_is_the_tensor():
    tensor = torch.ones(3)
    assert local_shard(tensor) is tensor


@pytest.mark.parametrize(
    ("config", "blocks"),
    [
        ("configs/quickstart.yaml", ["ViTLayer"]),
        ("configs/tasks/drivable_vit/tiny.yaml", ["Block"]),
        ("configs/tasks/video_lora/tiny.yaml", ["SpatioTemporalResBlock", "TransformerSpatioTemporalModel"]),
        ("configs/tasks/tts_lm/tiny.yaml", None),  # a transformers LM: its decoder layer, by default
    ],
)
def test_every_task_names_blocks_its_model_has_and_they_split_it(config, blocks, tmp_path):
    """A class name the model lacks makes accelerate raise at prepare; no name at all leaves the whole
    model one unit (gathered whole in every forward). Built on the meta device, as `plan` builds it."""
    from framer_ds.lab.census import largest_fsdp_unit, meta_model
    from framer_ds.tasks.registry import get_task_class
    from framer_ds.tasks.run_config import load_run_config

    loaded = load_run_config(REPO / config, [f"output_dir={tmp_path / 'run'}"])
    task = get_task_class(loaded.task)(loaded)
    model = meta_model(task)
    names = task.fsdp_block_classes(model)
    present = {type(module).__name__ for module in model.modules()}
    assert names and set(names) <= present
    if blocks is not None:
        assert names == blocks
    total = sum(p.numel() for p in model.parameters())
    assert largest_fsdp_unit(model, names) < total / 2  # the embeddings are units of their own too
