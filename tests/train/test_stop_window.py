"""A checkpoint that takes longer than a stop signal leaves says so (framer_ds/train/stop_window.py).
The kill itself, torchrun's agent SIGKILLing ranks mid-checkpoint 30 s after a stop, and the Slurm
scripts giving it the 300 s their USR1 warning leaves, are shown on the real cluster
(tests/launch/test_cluster.py, the USR1 stop with a 32 s checkpoint)."""

from __future__ import annotations

from conftest import mlp_config, train_in_process
from framer_ds.train.stop_window import slow_checkpoint_warning, stop_window


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
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "300")
    train_in_process(mlp_config(tmp_path / "d.yaml", tmp_path / "run2", train={"length.steps": 2}))
    out = capsys.readouterr()
    assert "a stop signal leaves" not in out.out + out.err
