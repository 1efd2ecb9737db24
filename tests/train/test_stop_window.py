"""A checkpoint that takes longer than a stop signal leaves says so (framer_ds/train/stop_window.py), and
a run whose checkpoint cannot fit says so at its start, sized from its trained state.
The kill itself, torchrun's agent SIGKILLing ranks mid-checkpoint 30 s after a stop, and the Slurm
scripts giving it the 300 s their USR1 warning leaves, are shown on the real cluster
(tests/launch/test_cluster.py, the USR1 stop with a 32 s checkpoint)."""

from __future__ import annotations

import torch

from conftest import mlp_config, train_in_process
from framer_ds.train.stop_window import (
    slow_checkpoint_warning,
    stop_checkpoint_forecast,
    stop_window,
    trained_state_bytes,
)

FORECAST = "a checkpoint of this run writes about"


def test_the_trained_state_is_sized_from_the_trainable_parameters_only():
    """fp32 weight + 2 fp32 Adam moments = 12 bytes an element; a bf16 weight under DeepSpeed adds its
    fp32 master copy (2 + 8 + 4); frozen parameters are not in a checkpoint (engine/checkpoint_weights)."""
    frozen, trained = torch.nn.Linear(100, 100), torch.nn.Linear(10, 10)  # 10,100 and 110 elements
    frozen.requires_grad_(False)
    parameters = [*frozen.parameters(), *trained.parameters()]
    assert trained_state_bytes(parameters, deepspeed=False) == 110 * 12
    assert (
        trained_state_bytes([p.to(torch.bfloat16) for p in trained.parameters()], deepspeed=True) == 110 * 14
    )
    slurm = {"FRAMER_DS_KILL_WAIT_S": "30"}
    assert stop_checkpoint_forecast(29 * 10**9, slurm) is None  # 29 s at 1 GB/s
    warning = stop_checkpoint_forecast(45 * 10**9, slurm)
    assert (
        warning.startswith(f"warning: {FORECAST} 45.0 GB on one node: 45 s at 1 GB/s")
        and "KillWait=30" in warning
    )
    assert stop_checkpoint_forecast(10**15, {}) is None  # no window: nothing kills a plain process


def test_the_shortest_known_window_counts():
    assert stop_window({}) is None  # a plain process: nothing kills it after a stop
    assert stop_window({"TORCHELASTIC_RUN_ID": "x"})[0] == 30  # torch's default
    slurm = {
        "TORCHELASTIC_RUN_ID": "x",
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "300",
        "FRAMER_DS_KILL_WAIT_S": "30",
    }
    seconds, source = stop_window(slurm)
    assert seconds == 30 and "KillWait=30" in source
    assert slow_checkpoint_warning(29, 4, slurm) is None
    warning = slow_checkpoint_warning(41, 4, slurm)
    assert warning.startswith("warning: checkpoint step_4 took 41 s to write, but a stop signal leaves 30 s")


def test_a_run_whose_checkpoint_outlasts_the_window_warns_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "0")  # any checkpoint is too slow
    config = mlp_config(
        tmp_path / "c.yaml", tmp_path / "run", train={"length.steps": 4, "checkpoint.every.steps": 2}
    )
    train_in_process(config)
    out = capsys.readouterr()
    assert (out.out + out.err).count("to write, but a stop signal leaves 0 s") == 1
    # at the start, from the MLP's trained elements: before its first checkpoint was written
    assert (out.out + out.err).count(FORECAST) == 1, out.out[-2000:]
    assert out.out.index(FORECAST) < out.out.index("checkpoint step_2 took"), out.out[-2000:]
    assert f"{FORECAST} 2.5 MB on one node" in out.out  # 206,081 elements x 12 bytes
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "300")
    train_in_process(mlp_config(tmp_path / "d.yaml", tmp_path / "run2", train={"length.steps": 2}))
    out = capsys.readouterr()
    assert "a stop signal leaves" not in out.out + out.err
