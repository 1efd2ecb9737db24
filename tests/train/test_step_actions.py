"""The loop as step actions: their order, when each is due, and throughput that excludes their time."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

from conftest import mlp_config, train_in_process
from framer_ds.config.cadence import Cadence
from framer_ds.tasks.run_config import load_run_config
from framer_ds.train import actions as actions_module
from framer_ds.train import loop
from framer_ds.train import step_context as step_context_module
from framer_ds.train.actions import StepAction, StepContext, Throughput


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_throughput_excludes_time_spent_in_actions(monkeypatch):
    """Two steps of 1 s each around a 10 s evaluation: 32 samples in 2 s of training, not in 1 s
    (the old loop restarted its clock after the eval but still counted both steps)."""
    clock = FakeClock()
    monkeypatch.setattr(step_context_module.time, "perf_counter", clock)
    meter = Throughput()
    clock.now += 1.0
    meter.record(16, 160.0)
    with meter.paused():
        clock.now += 10.0
    clock.now += 1.0
    meter.record(16, 40.0)
    assert meter.rates("tokens") == {"samples_per_s": 16.0, "tokens_per_s": 100.0}
    assert meter.rates(None) == {"samples_per_s": 16.0}


class RecordAfterEval(StepAction):
    """An action that reads the evaluation just made (as KeepBest does)."""

    name = "record"
    seen: ClassVar[list[tuple[int, dict]]] = []

    def due(self, ctx: StepContext) -> bool:
        return "eval/loss" in ctx.eval_metrics and ctx.state.global_step % 4 == 0

    def run(self, ctx: StepContext) -> None:
        RecordAfterEval.seen.append((ctx.state.global_step, dict(ctx.eval_metrics)))


def test_a_new_behaviour_is_one_more_action(tmp_path: Path, monkeypatch):
    config = mlp_config(
        tmp_path / "c.yaml", tmp_path / "run", train={"length.steps": 8, "eval.every.steps": 4}
    )
    real = loop.default_actions
    monkeypatch.setattr(loop, "default_actions", lambda run: [*real(run), RecordAfterEval(None)])
    RecordAfterEval.seen = []
    result = loop.run_training(load_run_config(config))
    assert [step for step, _ in RecordAfterEval.seen] == [4, 8]
    assert RecordAfterEval.seen[-1][1] == result.eval_metrics  # it ran after the evaluation of its step


@pytest.mark.parametrize(
    ("train", "names"),
    [
        ({}, ["log", "evaluate", "samples", "checkpoint"]),
        (
            {"eval.best_metric": "eval/loss", "eval.best_mode": "min"},
            ["log", "evaluate", "keep-best", "samples", "checkpoint"],
        ),
    ],
)
def test_keep_best_follows_the_evaluation_and_precedes_the_checkpoint(tmp_path: Path, train, names):
    """After the evaluation it reads, before the checkpoint that stores the best value it updates."""
    from types import SimpleNamespace

    config = load_run_config(mlp_config(tmp_path / "c.yaml", tmp_path / "run", train=train))
    run = SimpleNamespace(config=config, task=SimpleNamespace(sample_every=lambda: 0))
    assert [action.name for action in actions_module.default_actions(run)] == names


class Probe(StepAction):
    name = "probe"

    def run(self, ctx):  # pragma: no cover - only `due` is asked
        raise AssertionError


def context(step: int, done: bool, before: float = 0.0, now: float = 0.0) -> StepContext:
    """A step's context in a run of 10 optimizer steps per epoch, 40 in all."""
    from types import SimpleNamespace

    ctx = StepContext.__new__(StepContext)
    ctx.run = SimpleNamespace(plan=SimpleNamespace(updates_per_epoch=10, total_steps=40))
    ctx.state = type("S", (), {"global_step": step})()
    ctx.done, ctx.epoch_before, ctx.epoch_now = done, before, now
    return ctx


@pytest.mark.parametrize(
    ("cadence", "step", "done", "due"),
    [
        (Cadence(steps=4), 4, False, True),
        (Cadence(steps=4), 5, False, False),
        (Cadence(steps=4), 5, True, True),
        (Cadence(fraction=0.25), 10, False, True),  # a quarter of 40 steps
        (Cadence(fraction=0.25), 12, False, False),
        (None, 5, True, False),
    ],
)
def test_on_its_cadence_and_at_the_end(cadence, step, done, due):
    assert Probe(cadence).due(context(step, done)) is due


@pytest.mark.parametrize(
    ("before", "now", "done", "due"),
    [
        (0.49, 0.51, False, True),
        (0.3, 0.49, False, False),
        (0.5, 0.7, False, False),
        (0.9, 1.0, False, True),
        (0.6, 0.7, True, True),
        (0.0, 0.5, False, True),
    ],
)
def test_every_half_epoch_fires_on_the_step_that_crosses_it(before, now, done, due):
    assert Probe(Cadence(epochs=0.5)).due(context(7, done, before, now)) is due


def test_every_run_ends_its_accelerator_exactly_once(tmp_path: Path, monkeypatch):
    """Success and failure alike: trackers finished and the process group destroyed once (the old
    loop did it only when a tracker was configured, and a rank could abort at interpreter exit)."""
    from framer_ds.train.faults import NonFiniteLossError

    calls: list[bool] = []
    real = loop.end_accelerator

    def spy(accelerator, *, failed):
        calls.append(failed)
        real(accelerator, failed=failed)

    monkeypatch.setattr(loop, "end_accelerator", spy)
    good = mlp_config(tmp_path / "good.yaml", tmp_path / "good", train={"length.steps": 2})
    train_in_process(good)
    assert calls == [False]
    bad = mlp_config(
        tmp_path / "bad.yaml",
        tmp_path / "bad",
        data={"poison_ids": list(range(512))},
        train={"nonfinite.policy": "abort"},
    )
    with pytest.raises(NonFiniteLossError):
        loop.run_training(load_run_config(bad))
    assert calls == [False, True]


def test_warnings_and_log_records_print_above_the_progress_bar(monkeypatch):
    """While the bar is drawn, library warnings and log records go through tqdm.write, which clears
    the bar, prints, and redraws it (a plain print lands in the middle of the bar's line)."""
    import logging
    import warnings

    from tqdm.std import tqdm

    from framer_ds.train import console

    written: list[str] = []
    monkeypatch.setattr(tqdm, "write", classmethod(lambda cls, s, file=None, **kw: written.append(s)))
    library = logging.getLogger("framer_test_library")
    library.addHandler(logging.StreamHandler())
    bar = tqdm(total=3, disable=False)
    with console.above_the_progress_bar(), warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a library warning", UserWarning, stacklevel=1)
        library.warning("a library log record")
    bar.close()
    assert any("a library warning" in line for line in written)
    assert any("a library log record" in line for line in written)


def test_a_logger_that_prints_nowhere_stays_silent_above_the_progress_bar(monkeypatch):
    """torch.distributed.checkpoint's telemetry logger (`c10d-NullHandler-dcp_logger`: level DEBUG, a
    NullHandler, no propagation) logs a dict per checkpoint phase on every rank. The redirection gave
    every logger a console handler, so each FSDP2 checkpoint printed ~50 such dicts through the bar;
    only loggers that already print to the console (and the root logger, which the rest propagate to)
    are redirected."""
    import logging

    from tqdm.std import tqdm

    from framer_ds.train import console

    written: list[str] = []
    monkeypatch.setattr(tqdm, "write", classmethod(lambda cls, s, file=None, **kw: written.append(s)))
    silent = logging.getLogger("framer_test_telemetry")
    silent.setLevel(logging.DEBUG)
    silent.addHandler(logging.NullHandler())
    silent.propagate = False
    propagating = logging.getLogger("framer_test_propagating")
    with console.above_the_progress_bar():
        silent.debug({"checkpoint_id": "step_2", "event": "start"})
        propagating.warning("a record the root logger prints")
    assert not any("checkpoint_id" in line for line in written), written
    assert any("a record the root logger prints" in line for line in written), written
    assert silent.handlers and all(isinstance(h, logging.NullHandler) for h in silent.handlers)
