"""train.checkpoint_blocks: each ViTLayer of the quickstart is checkpointed whole. The losses are the
eager ones exactly (fp32 on CPU: the recomputed forward runs the same kernels on the same inputs, and
non-reentrant checkpointing restores the RNG state, so dropout draws the same masks), the parameter
names do not change, and the planner's activation probe sees the smaller graph."""

from __future__ import annotations

from conftest import TINY_VIT_OVERRIDES, read_metrics, train_in_process
from framer_ds.lab.activations import probe_config
from framer_ds.lab.census import meta_model
from framer_ds.tasks.registry import get_task_class
from framer_ds.tasks.run_config import load_run_config

QUICKSTART = "configs/quickstart.yaml"


def losses(run_dir, *overrides: str) -> list[float]:
    train_in_process(
        QUICKSTART, [f"output_dir={run_dir}", *TINY_VIT_OVERRIDES, "train.length.steps=4", *overrides]
    )
    return [line["loss"] for line in read_metrics(run_dir)[0]]


def test_checkpointed_blocks_train_the_same_losses_with_the_same_names(tmp_path):
    plain = losses(tmp_path / "plain")
    blocks = losses(tmp_path / "blocks", "train.checkpoint_blocks=true")
    assert len(plain) == 4 and blocks == plain
    names = {}
    for setting in ("false", "true"):
        config = load_run_config(QUICKSTART, [f"train.checkpoint_blocks={setting}"])
        names[setting] = [n for n, _ in meta_model(get_task_class(config.task)(config)).named_parameters()]
    assert names["true"] == names["false"] and len(names["true"]) > 10


def test_the_planner_measures_fewer_activations_with_checkpointed_blocks():
    plain = probe_config(QUICKSTART, ["train.micro_batch_size=64"])
    blocks = probe_config(QUICKSTART, ["train.micro_batch_size=64", "train.checkpoint_blocks=true"])
    assert blocks.per_sample < plain.per_sample, (blocks.per_sample, plain.per_sample)
