"""The planner's parameter census: the model training builds, counted on the meta device, no weight read."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from framer_ds.engine.pretrained import empty_weights
from framer_ds.engine.zero_buffers import ParameterSizes
from framer_ds.lab.census import census_of, config_census, task_census
from framer_ds.tasks.registry import get_task_class
from framer_ds.tasks.run_config import load_run_config

REPO = Path(__file__).resolve().parents[2]
TINY_CONFIGS = [
    "configs/quickstart.yaml",
    "configs/tasks/video_lora/tiny.yaml",
    "configs/tasks/tts_lm/tiny.yaml",
]


@pytest.mark.parametrize("config", TINY_CONFIGS)
def test_meta_census_counts_exactly_what_training_builds(config):
    """LoRA adapters, the widened input conv and the resized TTS embeddings included: the meta build
    must count every parameter the real build (weights read from disk) has."""
    run_config = load_run_config(REPO / config)
    task = get_task_class(run_config.task)(run_config)
    planned = task_census(task)  # runs prepare_data: the built-in data and tiny models exist after it
    real = task.build_model()
    sizes = ParameterSizes.of(real)
    assert (planned.trainable, planned.trainable + planned.frozen) == (sizes.trainable, sizes.total)
    assert planned.largest_trainable == max(p.numel() for p in real.parameters() if p.requires_grad)
    assert planned.trainable > 0


def test_frozen_helpers_count_only_when_they_stay_on_the_device():
    tiny = REPO / "configs/tasks/video_lora/tiny.yaml"
    assert config_census(tiny).helper_bytes > 0  # no latent cache: VAE + image encoder stay on every rank
    assert config_census(tiny, ["data.cache.enabled=true"]).helper_bytes == 0


def test_census_reads_no_weight_file(tmp_path):
    """A pretrained directory whose weights are garbage: the census still works (it reads config.json
    only, and every parameter is a meta tensor), while loading it for training fails."""
    from transformers import ViTConfig, ViTForImageClassification

    pretrained = tmp_path / "vit"
    config = ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2
    )
    ViTForImageClassification(config).save_pretrained(pretrained)
    (pretrained / "model.safetensors").write_bytes(b"not a safetensors file")
    overrides = [f"model.source.path={pretrained}", "model.source.config=null"]
    run_config = load_run_config(REPO / "configs/quickstart.yaml", overrides)
    task = get_task_class(run_config.task)(run_config)
    planned = task_census(task)
    with empty_weights():
        assert all(p.is_meta for p in task.build_model().parameters())
    head = 32 * 10 + 10  # the digits' 10 classes replace the checkpoint's head
    body = sum(
        p.numel() for n, p in ViTForImageClassification(config).named_parameters() if "classifier" not in n
    )
    assert planned.trainable == body + head
    with pytest.raises(Exception, match="deserializing header"):  # safetensors reads the file
        task.build_model()


def test_census_of_splits_trainable_frozen_and_persistent():
    model = torch.nn.Sequential(torch.nn.Linear(100, 100), torch.nn.LayerNorm(100), torch.nn.Linear(100, 10))
    model[0].requires_grad_(False)
    found = census_of(model, helpers=[torch.nn.Linear(10, 10)], mixed_precision="bf16")
    assert found.frozen == 100 * 100 + 100
    assert found.trainable == 200 + 100 * 10 + 10
    assert found.largest_trainable == 1000
    assert found.helper_bytes == 110 * 2  # helpers run in the compute dtype
    # persistence: the small tensors (<= 1% of the model together) stay whole under ZeRO-3
    assert 0 < found.persistent_small <= 0.01 * (found.trainable + found.frozen)
