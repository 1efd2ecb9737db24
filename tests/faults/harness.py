"""What the fault cases share: the registry (`@case`) and ways to run framer-ds (in this process, or as
a real process) on the test MLP task (tests/framer_test_tasks.py)."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from conftest import mlp_config, read_metrics, reset_accelerate


@dataclass(frozen=True)
class Case:
    name: str
    fault: str
    expected: str
    check: Callable[[Path], str]
    multi_process: bool = False


CASES: list[Case] = []


def case(fault: str, expected: str, multi_process: bool = False):
    def register(check: Callable[[Path], str]) -> Callable[[Path], str]:
        CASES.append(Case(check.__name__, fault, expected, check, multi_process))
        return check

    return register


# --- running framer-ds -------------------------------------------------------------------------------


@dataclass
class Result:
    rc: int
    out: str
    err: str


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def cli(*argv: str) -> Result:
    """`framer-ds ARGV` in this process (a single-process run), output captured."""
    from framer_ds.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(argv))
        except SystemExit as exc:
            rc = int(exc.code or 0)
        except Exception as exc:  # a traceback is an outcome too: the case decides whether it is wanted
            rc = -1
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        finally:
            reset_accelerate()
    return Result(rc, out.getvalue(), err.getvalue())


def framer_ds(*argv: str) -> list[str]:
    return [sys.executable, "-m", "framer_ds", *argv]


def train_steps(run_dir: Path) -> list[int]:
    return [line["step"] for line in read_metrics(run_dir)[0]]


def mlp(tmp: Path, name: str = "run", **sections) -> tuple[Path, Path]:
    run_dir = tmp / name
    return mlp_config(tmp / f"{name}.yaml", run_dir, **sections), run_dir


def ddp_train_cmd(config: Path, *overrides: str) -> list[str]:
    """`accelerate launch --multi_gpu --num_processes 2 -m framer_ds train CONFIG OVERRIDES` (DDP on CPU)."""
    from conftest import accelerate_launch_cmd

    return accelerate_launch_cmd(
        "--multi_gpu", "--num_processes", "2", "-m", "framer_ds", "train", str(config), *overrides
    )


def run_with_checkpoints_at_4_and_8(tmp: Path) -> tuple[Path, Path, Path, Path]:
    """(config, run, step_4, step_8): a finished 8-step run that checkpointed at steps 4 and 8."""
    config, run = mlp(tmp, train={"length.steps": 8, "checkpoint.every.steps": 4, "checkpoint.keep_last": 3})
    assert cli("train", str(config)).rc == 0
    return config, run, run / "checkpoints" / "step_4", run / "checkpoints" / "step_8"
