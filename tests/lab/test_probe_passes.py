"""The activation probe's passes side by side in forked processes (lab/probe_passes.py): the same figures
as one after another, in order; a child that fails hands its passes back to the parent, which raises
their error as a sequential probe would."""

from __future__ import annotations

import os

import pytest

from conftest import REPO, TINY_VIT_OVERRIDES
from framer_ds.config.errors import ConfigError
from framer_ds.lab.activations import probe_activations
from framer_ds.lab.probe_passes import PROBE_WORKERS_ENV, probe_workers, run_passes
from framer_ds.tasks.registry import get_task_class
from framer_ds.tasks.run_config import load_run_config

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")


@needs_fork
def test_passes_run_in_children_and_come_back_in_order():
    parent = os.getpid()
    pids = run_passes([lambda i=i: os.getpid() * 10 + i for i in range(5)], workers=3)
    assert [p % 10 for p in pids] == [0, 1, 2, 3, 4]
    assert {p // 10 for p in pids[0::3]} == {parent}  # the parent runs its share (0, 3)
    assert all(p // 10 != parent for p in pids[1:3])  # passes 1 and 2 ran in two children


@needs_fork
def test_a_failed_child_hands_its_passes_back_and_the_parent_raises_their_error():
    parent = os.getpid()

    def only_here() -> int:
        if os.getpid() != parent:
            raise RuntimeError("a child cannot run this")
        return 7

    assert run_passes([lambda: 1, only_here], workers=2) == [1, 7]

    def broken() -> int:
        raise ValueError("broken pass")

    with pytest.raises(ValueError, match="broken pass"):
        run_passes([lambda: 1, broken], workers=2)


def test_the_worker_count_comes_from_the_environment_or_the_cores(monkeypatch):
    monkeypatch.setenv(PROBE_WORKERS_ENV, "3")
    assert probe_workers() == 3
    monkeypatch.delenv(PROBE_WORKERS_ENV)
    assert probe_workers() >= 1
    monkeypatch.setenv(PROBE_WORKERS_ENV, "two")
    with pytest.raises(ConfigError, match=f"{PROBE_WORKERS_ENV}: 'two' is not a process count"):
        probe_workers()


@needs_fork
def test_a_probe_side_by_side_measures_what_it_measures_one_at_a_time(monkeypatch, data_cache):
    """The tiny ViT cut to 2 and 3 blocks (4 training passes) with and without checkpointing."""

    def probe(workers: str, checkpointing: bool):
        monkeypatch.setenv(PROBE_WORKERS_ENV, workers)
        overrides = [*TINY_VIT_OVERRIDES, f"train.gradient_checkpointing={checkpointing}"]
        config = load_run_config(REPO / "configs/quickstart.yaml", overrides)
        return probe_activations(get_task_class(config.task)(config))

    for checkpointing in (False, True):
        assert probe("2", checkpointing) == probe("1", checkpointing)


@needs_fork
@pytest.mark.timeout(120)
def test_a_child_computes_after_the_parent_ran_openmp_threads():
    """OpenMP's thread pool does not survive a fork: without one thread in the child, a child's first
    parallel kernel waited forever for the parent's threads (a plan hung on an example batch)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert torch.ones(2**22).sum() == 2**22  # a parallel region: the pool exists in this process
        passes = [lambda k=k: int(torch.ones(2**22).sum()) + k for k in range(2)]
        assert run_passes(passes, workers=2) == [2**22, 2**22 + 1]
    finally:
        torch.set_num_threads(threads)


def test_fake_parameters_made_directly_are_what_to_empty_makes_in_fake_mode():
    """The probe makes a model's parameters and buffers fake without `to_empty`'s slow fake dispatch
    (lab/activations.py `_to_empty`): each must be what `to_empty` gave - same class, shape, strides
    (a transposed weight included), dtype, device, trainability, gradient - each on a storage of its own."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from framer_ds.lab.activations import _to_empty

    def model() -> torch.nn.Module:
        with torch.device("meta"):
            built = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4).to(torch.bfloat16))
            built[0].weight = torch.nn.Parameter(torch.empty(3, 4).t())  # strides (1, 4)
            built[1].requires_grad_(False)
            built[0].bias.grad = torch.empty(4)
        built.register_buffer("steps", torch.arange(5))  # a buffer left on the CPU, as empty_weights does
        return built

    def described(module: torch.nn.Module) -> list[tuple]:
        tensors = [*module.named_parameters(), *module.named_buffers()]
        tensors += [(f"{name}.grad", p.grad) for name, p in module.named_parameters() if p.grad is not None]
        return [
            (
                name,
                type(t).__name__,
                type(t.data).__name__,
                t.shape,
                t.stride(),
                t.dtype,
                t.device,
                t.requires_grad,
            )
            for name, t in tensors
        ]

    slow, fast = model(), model()
    with FakeTensorMode(allow_non_fake_inputs=True):
        slow.to_empty(device="cpu")
    _to_empty(fast, FakeTensorMode(allow_non_fake_inputs=True), "cpu")
    assert described(fast) == described(slow)
    assert described(fast)[0][2:5] == ("FakeTensor", (4, 3), (1, 4))
    storages = {t.untyped_storage()._cdata for t in [*fast.parameters(), *fast.buffers(), fast[0].bias.grad]}
    assert len(storages) == 6
