"""A checkpoint's model weights without the frozen base (engine/checkpoint_weights.py): what a load
accepts as missing, and the one line when a checkpoint does not fit the model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from framer_ds.config.errors import RunSetupError
from framer_ds.engine.checkpoint_weights import _drop_frozen, _load_trainable


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    model[0].requires_grad_(False)  # the frozen base
    return model


def test_the_saved_state_drops_frozen_parameters_and_keeps_buffers_and_trained_ones(tmp_path: Path) -> None:
    """BatchNorm's running statistics change in training although no optimizer touches them: kept."""
    model = _model()
    weights = [model.state_dict()]
    _drop_frozen([model], weights, str(tmp_path))
    batch_norm = ["1.bias", "1.num_batches_tracked", "1.running_mean", "1.running_var", "1.weight"]
    assert sorted(weights[0]) == [*batch_norm, "2.bias", "2.weight"]


def test_a_checkpoint_without_the_frozen_base_loads_and_one_missing_a_trained_tensor_is_refused(
    tmp_path: Path,
) -> None:
    trained = _model()
    with torch.no_grad():
        trained[2].weight.add_(1.0)
    state = trained.state_dict()
    _drop_frozen([trained], [state], str(tmp_path))
    save_file(state, str(tmp_path / "model.safetensors"))
    fresh, models = _model(), []
    models.append(fresh)
    _load_trainable(models, str(tmp_path))
    assert models == []  # loaded here: accelerate's strict loader does not see it
    assert torch.equal(fresh[2].weight, trained[2].weight) and torch.equal(fresh[0].weight, trained[0].weight)
    del state["2.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(RunSetupError, match=r"1 trained tensor\(s\) missing, 0 unexpected \(2.weight\)"):
        _load_trainable([_model()], str(tmp_path))


class _TiedHead(torch.nn.Module):
    """An LM whose output head is its input embedding (Granite's tie_word_embeddings)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(8, 4)
        self.frozen = torch.nn.Linear(4, 4).requires_grad_(False)
        self.head = torch.nn.Linear(4, 8, bias=False)
        self.head.weight = self.embed.weight


def test_a_tied_head_stored_once_is_not_missing(tmp_path: Path) -> None:
    """safetensors stores a shared tensor under one name (accelerate's save drops the alias): the Granite
    smoke's resume was refused with "1 trained tensor(s) missing (lm_head.weight)" before."""
    from safetensors.torch import save_model

    trained = _TiedHead()
    with torch.no_grad():
        trained.embed.weight.add_(1.0)
    save_model(trained, str(tmp_path / "model.safetensors"))  # one of embed.weight / head.weight
    fresh = _TiedHead()
    _load_trainable([fresh], str(tmp_path))
    assert torch.equal(fresh.head.weight, trained.embed.weight) and fresh.head.weight is fresh.embed.weight
