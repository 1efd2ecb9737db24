"""The activation probe's depth cut (lab/activations.py): a model whose repeated blocks are one stack of
identical blocks is probed at 2 and 3 blocks and the line extended to its full depth. The figures must be
the full-depth probe's to the byte, not close: each block adds the same saved tensors and runs the same
backward temporaries, so the peak is an exact linear function of the block count, and the extension is
integer arithmetic on two measured peaks (no rounding). Checked on the three kinds of stack the shipped
recipes plan (a ViT encoder: tests/lab/test_planner.py's first test, a Llama decoder, a Wan transformer)
with checkpointing off, the model's own, and `train.checkpoint_blocks`; the shipped 14B recipes' header
figures (tests/lab/test_planner.py), planned at full depth when written, are the full-size check."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import REPO
from framer_ds.lab.activations import PROBE_DEPTHS, probe_activations, repeated_stack
from framer_ds.tasks.registry import get_task_class
from framer_ds.tasks.run_config import load_run_config


def _with_depth(folder: Path, config_file: str, key: str, depth: int, into: Path) -> Path:
    """A copy of a tiny model folder whose config says `depth` blocks (the probe builds from the config
    on the meta device, so no weight needs to match)."""
    shutil.copytree(folder, into)
    config = json.loads((into / config_file).read_text())
    config[key] = depth
    (into / config_file).write_text(json.dumps(config))
    return into


def _assert_cut_is_exact(config_path: Path, overrides: list[str], depth: int) -> None:
    def task():
        config = load_run_config(config_path, overrides)
        return get_task_class(config.task)(config)

    cut, whole = probe_activations(task()), probe_activations(task(), scale_depth=False)
    assert cut.depth == (*PROBE_DEPTHS, depth) and whole.depth == ()
    assert cut.measured_bytes == whole.measured_bytes and cut.measured_bytes[1] > cut.measured_bytes[0]
    assert (cut.fixed, cut.per_sample, cut.eval_transient) == (
        whole.fixed,
        whole.per_sample,
        whole.eval_transient,
    )


def test_llama_decoder_cut_matches_the_full_probe(tiny_tts, tmp_path):
    """The tiny Llama at 5 layers, fp32, no checkpointing: every layer's activations saved."""
    model = _with_depth(tiny_tts / "model", "config.json", "num_hidden_layers", 5, tmp_path / "llama5")
    overrides = [f"output_dir={tmp_path / 'run'}", "model.source.builtin=null", f"model.source.path={model}"]
    _assert_cut_is_exact(REPO / "configs/tasks/tts_lm/tiny.yaml", overrides, 5)


@pytest.mark.slow  # ~35 s on 2 busy cores: the tiny Wan built and probed three ways
def test_wan_transformer_cut_matches_the_full_probe(tiny_wan_bases, tmp_path):
    """The tiny Wan FLF2V at 5 blocks, bf16 with every block checkpointed (as the 14B recipes run)."""
    folder = _with_depth(
        tiny_wan_bases["flf2v"], "transformer/config.json", "num_layers", 5, tmp_path / "wan5"
    )
    overrides = [
        f"output_dir={tmp_path / 'run'}",
        "model.base.source.builtin=null",
        f"model.base.source.path={folder}",
        "train.checkpoint_blocks=true",
        "train.mixed_precision=bf16",
    ]
    _assert_cut_is_exact(REPO / "configs/tasks/video_lora/wan_tiny.yaml", overrides, 5)


class Block(torch.nn.Module):
    def __init__(self, width: int = 4):
        super().__init__()
        self.linear = torch.nn.Linear(width, width)


class Other(Block):
    pass


class Stacked(torch.nn.Module):
    def __init__(self, *stacks: list[torch.nn.Module], layer_types: list[str] | None = None):
        super().__init__()
        self.stacks = torch.nn.ModuleList(torch.nn.ModuleList(blocks) for blocks in stacks)
        if layer_types is not None:
            self.config = type("Config", (), {"layer_types": layer_types})()


def test_only_one_stack_of_alike_blocks_longer_than_the_probe_is_cut():
    """Anything else runs whole: the extension would not be exact (or not cheaper)."""
    names = [Block.__name__, Other.__name__]
    one = Stacked([Block() for _ in range(4)])
    assert repeated_stack(one, names) is one.stacks[0]
    assert repeated_stack(Stacked([Block() for _ in range(PROBE_DEPTHS[-1])]), names) is None
    assert repeated_stack(Stacked([Block() for _ in range(4)], [Block() for _ in range(4)]), names) is None
    assert repeated_stack(Stacked([*(Block() for _ in range(3)), Block(width=8)]), names) is None
    assert repeated_stack(Stacked([*(Block() for _ in range(3)), Other()]), names) is None
    frozen = Stacked([Block() for _ in range(4)])
    frozen.stacks[0][3].requires_grad_(False)
    assert repeated_stack(frozen, names) is None
    mixed = Stacked([Block() for _ in range(4)], layer_types=["full", "sliding", "full", "full"])
    assert repeated_stack(mixed, names) is None
    assert repeated_stack(one, []) is None
