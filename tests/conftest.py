"""Shared fixtures: a per-session data cache, accelerate state reset, and a tiny-ViT run config."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from launching import (  # re-exported: the tests import them from conftest (tests/launching.py)
    ABORT_MARKERS as ABORT_MARKERS,
)
from launching import (
    REPO,
)
from launching import (
    abort_lines as abort_lines,
)
from launching import (
    accelerate_launch_cmd as accelerate_launch_cmd,
)
from launching import (
    free_port as free_port,
)
from launching import (
    launch_ddp_train as launch_ddp_train,
)
from launching import (
    launch_env as launch_env,
)
from launching import (
    rank_processes as rank_processes,
)
from launching import (
    start_process as start_process,
)
from launching import (
    strategy_launch_args as strategy_launch_args,
)
from launching import (
    wait_for_step as wait_for_step,
)
from launching import (
    write_deepspeed_json as write_deepspeed_json,
)

from scheduling import FileSeconds, order_heaviest_first

if TYPE_CHECKING:
    from framer_ds.train.loop import TrainResult


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) sees every report
        config.pluginmanager.register(FileSeconds(), "file_seconds")
    # As an activated venv would: its tools first on PATH for every process the tests start. DeepSpeed
    # JIT-builds its CPU ops with the first `ninja` on PATH into one shared cache; with the system's
    # ninja for some launches and the venv's for others (a launcher that puts its own bin dir first),
    # each switch of ninja version discards the build log and rebuilds the op (~1 min each, 3-4 times
    # per suite).
    venv_bin = str(Path(sys.executable).parent)
    if os.environ.get("PATH", "").split(os.pathsep)[0] != venv_bin:
        os.environ["PATH"] = os.pathsep.join(filter(None, [venv_bin, os.environ.get("PATH")]))
    # DeepSpeed's JIT ops (cpu_adam for offload) build into torch's extension cache,
    # by default one per user (~/.cache/torch_extensions). The build command names the venv's include
    # paths, so two venvs (a fresh clone beside a checkout, git worktrees) sharing it rebuild each other's
    # ops in turn (~1-5 min each on 2 cores, a lock held meanwhile): a 2-process offload run waited 600 s
    # on one. One cache per venv builds each op once.
    if sys.prefix != sys.base_prefix:  # in a venv
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # The plan probe's passes one after another in the test's process: the suite already runs one
    # xdist worker per core, so forked passes only contend, and each fork's FakeTensor cache dies with
    # it (the offline plan of every shipped config: 229 CPU s in one process, 316 s forked).
    os.environ.setdefault("FRAMER_DS_PROBE_WORKERS", "1")
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # make's own variables are not the user's shell: DeepSpeed's pdsh runner exports every variable to
    # the nodes inside double quotes, and `make test PYTEST_ARGS=...` sets MAKEOVERRIDES to
    # `${-*-command-variables-*-}`, a bash "bad substitution" on every node (the hostfile test failed).
    for name in ("MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES", "MAKELEVEL"):
        os.environ.pop(name, None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    order_heaviest_first(items)
    # Opt-in tiers: run only when named in -m (their Makefile targets do), never in `make test`.
    opt_in = {
        "readme_full": "runs every README training for real: `make test-readme`",
        "smoke_full": "smokes a recipe the default suite's representatives cover: `make test-smoke`",
        "gpu_suite_full": "the GPU suite's real CPU smoke; its stubbed twin runs here: `make test-gpu-suite`",
    }
    for marker, reason in opt_in.items():
        if marker not in (config.getoption("markexpr") or ""):
            for item in items:
                if marker in item.keywords:
                    item.add_marker(pytest.mark.skip(reason=reason))
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


@pytest.fixture(scope="session")
def tiny_tts(data_cache: Path) -> Path:
    """The tts_lm tests' tiny Llama, tokenizer, SNAC codec and speech data, built once per session."""
    from framer_ds.tasks.tts_lm.tiny import ensure_tiny_tts

    return ensure_tiny_tts()


@pytest.fixture(scope="session")
def tiny_wan_bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny random Wan bases ("i2v": first frame; "flf2v": first + last frame), built once a session."""
    from framer_ds.tasks.video_lora.wan.tiny import create_tiny_wan

    root = tmp_path_factory.mktemp("tiny_wan_bases")
    return {mode: create_tiny_wan(root / mode, mode=mode) for mode in ("i2v", "flf2v")}


def reset_accelerate() -> None:
    """Clear accelerate's process-wide state (AcceleratorState, GradientState: singletons that outlive an
    Accelerator), so the next Accelerator built in this process (a training, `framer-ds eval`, a test's
    own `build_accelerator`) starts from its own config rather than the last one's: the package's
    `engine.accelerator.reset_accelerate_state` (`framer-ds smoke` runs several commands in one process).
    The tests' one entry to it: `fresh_accelerate_state`, `train_in_process`, the fault harness and tests
    that build an Accelerator without `run_training` call it."""
    from framer_ds.engine.accelerator import reset_accelerate_state

    reset_accelerate_state()


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """Accelerator state is a process-wide singleton; each in-process run starts clean."""
    yield
    reset_accelerate()


def train_in_process(config: str | Path, overrides: Sequence[str] = ()) -> TrainResult:
    """`framer-ds train CONFIG OVERRIDES` in this process (`run_training`, its result returned), then
    `reset_accelerate()` whether it finished or raised, so a module fixture or a test can train again
    (`fresh_accelerate_state` resets only after each test, and not after a module fixture that raised)."""
    from framer_ds.tasks.run_config import load_run_config
    from framer_ds.train.loop import run_training

    try:
        return run_training(load_run_config(config, overrides))
    finally:
        reset_accelerate()


@contextlib.contextmanager
def umask(value: int) -> Iterator[None]:
    """Run the body under the process umask `value` (a user's `umask 022`), then restore the old one."""
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


def wrong_modes(root: Path, mask: int) -> list[str]:
    """Every file and directory under `root` (itself included) whose permission bits are not what a
    plain `open()` / `mkdir()` gives under umask `mask` (0o666 / 0o777 & ~mask), as 'path 0o600'."""
    wrong = []
    for path in [Path(root), *sorted(Path(root).rglob("*"))]:
        if path.is_symlink():
            continue
        wanted = (0o777 if path.is_dir() else 0o666) & ~mask
        if stat.S_IMODE(path.stat().st_mode) != wanted:
            wrong.append(f"{path.relative_to(root)} {oct(stat.S_IMODE(path.stat().st_mode))}")
    return wrong


@contextlib.contextmanager
def fp16_loss_scaler_on_cpu(init_scale: float = 2.0**10) -> Iterator[None]:
    """Runs started in this process meanwhile get torch's GradScaler, as accelerate gives an fp16 run on a
    GPU (it builds none on a CPU): the loss is scaled, and a step whose gradients hold an inf/NaN updates
    nothing and halves the scale, the fp16 overflow skip. The test MLP task makes chosen gradients NaN
    with a finite loss (`data.bad_grad_batches`). No clipping (train.optimizer.max_grad_norm=0) keeps it
    faithful: accelerate unscales before clipping only under fp16, which a CPU accelerator is not."""
    from unittest import mock

    import framer_ds.train.loop as loop

    build = loop.build_accelerator

    def with_scaler(config, **kwargs):
        accelerator = build(config, **kwargs)
        accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
        return accelerator

    with mock.patch.object(loop, "build_accelerator", with_scaler):
        yield


TINY_VIT_OVERRIDES = [
    "train.length.epochs=1",
    "train.micro_batch_size=16",
    "train.eval.every=null",
    "train.checkpoint.every=null",
    "train.lr_schedule.warmup.steps=2",
    "train.eval.max_batches=4",
]


@pytest.fixture
def quickstart_overrides(tmp_path: Path) -> list[str]:
    """The shipped quickstart config shrunk to a few seconds, writing into tmp_path/run."""
    return [f"output_dir={tmp_path / 'run'}", *TINY_VIT_OVERRIDES]


def scratch_copy(dest: Path) -> Path:
    """The files a fresh clone of this working tree would hold (tracked and untracked-but-not-ignored,
    with their mtimes), plus a `.venv` link to the venv running the tests. The README test runs its
    commands there, the real-cluster tests their launches (logs/, runs/, .deepspeed_env land there)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    venv = Path(sys.executable).parent.parent
    (dest / ".venv").symlink_to(venv)
    installed = venv / ".installed"
    if installed.exists():
        # make's set-up target is done when .venv/.installed is newer than pyproject.toml: as after a
        # newcomer's first `make`. (Left older, make would `pip install -e` the scratch copy into the venv.)
        stamp = installed.stat().st_mtime - 1
        os.utime(dest / "pyproject.toml", (stamp, stamp))
    return dest


def read_metrics(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """(training lines, eval lines) of a run's metrics.jsonl."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if "loss" in x], [x for x in lines if any(k.startswith("eval/") for k in x)]


def set_keys(config: dict, **sections: dict) -> dict:
    """`config` with dotted keys set per section (`train={"length.steps": 8, "eval.every": None}`) as
    command-line overrides set them: an override of one unit of a Cadence replaces its unit."""
    import json

    from framer_ds.config.loader import apply_overrides
    from framer_ds.config.one_of import one_of_groups
    from framer_ds.config.schema import RunConfigBase

    overrides = [
        f"{name}.{key}={json.dumps(value)}" for name, keys in sections.items() for key, value in keys.items()
    ]
    problems = apply_overrides(config, overrides, one_of=one_of_groups(RunConfigBase))
    assert not problems, problems
    return config


def mlp_config(path: Path, run_dir: Path, **sections) -> Path:
    """A YAML for the test-only MLP task (tests/framer_test_tasks.py), with `sections` set on top of it
    (`set_keys`: dotted keys, e.g. `train={"length.steps": 8}`)."""
    import yaml

    config = {
        "imports": ["framer_test_tasks"],
        "task": "test_mlp_regression",
        "output_dir": str(run_dir),
        "model": {},
        "data": {},
        "train": {
            "seed": 7,
            "length": {"steps": 16},
            "micro_batch_size": 8,
            "gradient_accumulation_steps": 2,
            "optimizer": {"learning_rate": 1e-3, "max_grad_norm": 1.0},
            "lr_schedule": {"warmup": {"steps": 2}},
        },
    }
    path.write_text(yaml.safe_dump(set_keys(config, **sections)))
    return path


def mlp_lr_schedule(steps: int) -> list[float]:
    """The LR each of `steps` optimizer steps of an `mlp_config` run trains at (cosine, lr 1e-3, warmup 2),
    from the run's own scheduler code: a run's logged `lr` values equal these exactly."""
    from framer_ds.train.lr_schedule import build_lr_scheduler

    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1e-3)
    scheduler = build_lr_scheduler("cosine", optimizer, 2, steps)
    lrs = []
    for _ in range(steps):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return lrs


def launch_strategy_run(
    strategy: str, root: Path, name: str, env: dict[str, str] | None = None, **sections
) -> Path:
    """One 2-process run of the MLP task (`mlp_config` + `sections`) under `strategy`; its run dir.
    The ids each rank trained on are recorded in `root/<name>_ids/`. `env`: added to the launch's."""
    run_dir = root / name
    record = root / f"{name}_ids"
    record.mkdir()
    data = {"record_dir": str(record), **sections.pop("data", {})}
    config = mlp_config(root / f"{name}.yaml", run_dir, data=data, **sections)
    cmd = accelerate_launch_cmd(
        *strategy_launch_args(strategy, root), "-m", "framer_ds", "train", str(config)
    )
    proc = subprocess.run(
        cmd, cwd=REPO, env={**launch_env(), **(env or {})}, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"{strategy} failed:\n{proc.stderr[-5000:]}"
    return run_dir


REFERENCE_SECTIONS = {"train": {"checkpoint.every.steps": 16, "eval.every.steps": 16}}


@pytest.fixture(scope="session")
def ddp_reference_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted 2-process DDP run of the MLP task (16 steps, accumulation 2): the reference
    for strategy equivalence, preemption and kill/resume tests, launched once per session."""
    return launch_strategy_run("ddp", tmp_path_factory.mktemp("ddp_reference"), "ddp", **REFERENCE_SECTIONS)
