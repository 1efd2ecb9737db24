"""Shared fixtures: a per-session data cache, accelerate state reset, and a tiny-ViT run config."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session", autouse=True)
def data_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Builtin datasets (digits) render once per session into a temp cache, never into ~/.cache."""
    cache = tmp_path_factory.mktemp("framer_ds_cache")
    os.environ["FRAMER_DS_CACHE"] = str(cache)
    return cache


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """Accelerator state is a process-wide singleton; each in-process run starts clean."""
    yield
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


TINY_VIT_OVERRIDES = [
    "train.epochs=1",
    "train.micro_batch_size=16",
    "train.eval_every=null",
    "train.checkpoint_every=null",
    "train.warmup_steps=2",
    "train.max_eval_batches=4",
]


@pytest.fixture
def quickstart_overrides(tmp_path: Path) -> list[str]:
    """The shipped quickstart config shrunk to a few seconds, writing into tmp_path/run."""
    return [f"output_dir={tmp_path / 'run'}", *TINY_VIT_OVERRIDES]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def accelerate_launch_cmd(*launch_args: str) -> list[str]:
    """`accelerate launch` through this interpreter so the venv's packages are used."""
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--main_process_port",
        str(free_port()),
        *launch_args,
    ]


def read_metrics(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """(training lines, eval lines) of a run's metrics.jsonl."""
    import json

    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if "loss" in x], [x for x in lines if any(k.startswith("eval/") for k in x)]
