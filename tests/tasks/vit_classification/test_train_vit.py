"""The shared loop on the quickstart task (in-process, 1 CPU process): run-dir contract, learning,
pretrained loading. Exact resume is the contract suite's (tests/tasks/test_task_contract.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import ViTConfig, ViTForImageClassification

from conftest import read_metrics
from framer_ds.engine.checkpoint import STATE_FILE
from framer_ds.tasks.run_config import load_run_config
from framer_ds.train.loop import run_training

REPO = Path(__file__).resolve().parents[3]
QUICKSTART = REPO / "configs" / "quickstart.yaml"


def train(overrides: list[str]):
    return run_training(load_run_config(QUICKSTART, overrides))


def test_run_directory_contract(quickstart_overrides, tmp_path):
    result = train(
        [
            *quickstart_overrides,
            "train.length.steps=6",
            "train.checkpoint.every.steps=2",
            "train.eval.every.steps=3",
        ]
    )
    run = tmp_path / "run"
    assert result.global_step == 6
    assert load_run_config(run / "config.yaml").train.length.steps == 6  # resolved config reloads
    train_lines, eval_lines = read_metrics(run)
    assert [x["step"] for x in train_lines] == [1, 2, 3, 4, 5, 6]
    for line in train_lines:
        assert {"step", "loss", "lr", "samples_per_s", "memory/rss_gb"} <= set(line)
    assert [x["step"] for x in eval_lines] == [3, 6]
    assert {"eval/loss", "eval/accuracy"} <= set(eval_lines[-1])
    # checkpoint.keep_last=2 (quickstart) keeps the newest two; no temp dirs remain.
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_4", "step_6"]
    assert json.loads((run / "checkpoints" / "step_6" / STATE_FILE).read_text())["global_step"] == 6
    # final/ is loadable the way a user loads it, and equals the trained weights.
    model = ViTForImageClassification.from_pretrained(run / "final")
    assert model.config.num_labels == 10 and model.config.id2label[3] == "3"
    weights = load_file(run / "final" / "model.safetensors")
    assert all(w.numel() > 0 for w in weights.values())
    assert not (run / ".tmp_final").exists()


def test_loss_decreases_on_fixed_seed(quickstart_overrides, tmp_path):
    train([*quickstart_overrides, "train.length.steps=60", "train.optimizer.learning_rate=3e-3"])
    losses = [x["loss"] for x in read_metrics(tmp_path / "run")[0]]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.75 * first, (first, last)


def test_refuses_to_overwrite_an_existing_run(quickstart_overrides, tmp_path):
    from framer_ds.config.errors import ConfigError

    train([*quickstart_overrides, "train.length.steps=1"])
    with pytest.raises(ConfigError, match="already holds a run"):
        train([*quickstart_overrides, "train.length.steps=1"])


def test_pretrained_directory_with_adapted_label_count(quickstart_overrides, tmp_path):
    """A model saved with save_pretrained (5 labels) fine-tunes on 10 classes: the head is re-made."""
    pretrained = tmp_path / "pretrained_vit"
    config = ViTConfig(
        image_size=8,
        patch_size=4,
        num_channels=1,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=5,
    )
    torch.manual_seed(0)
    source = ViTForImageClassification(config)
    source.save_pretrained(pretrained)
    overrides = [
        *quickstart_overrides,
        "train.length.steps=2",
        "model.source.config=null",
        f"model.source.path={pretrained}",
    ]
    train(overrides)
    tuned = ViTForImageClassification.from_pretrained(tmp_path / "run" / "final")
    assert tuned.classifier.out_features == 10
    # the backbone started from the saved weights, not a fresh init (2 small steps move it only a little)
    delta = (
        (
            tuned.vit.embeddings.patch_embeddings.projection.weight
            - source.vit.embeddings.patch_embeddings.projection.weight
        )
        .abs()
        .max()
    )
    assert delta < 0.05
