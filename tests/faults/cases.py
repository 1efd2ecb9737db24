"""The fault matrix: each case injects one fault into a real run (a kill at a chosen phase, a truncated
file, a second run, an edited config, a signal during start-up) and checks what the user gets.

A case returns what it observed and raises AssertionError when the outcome is wrong. The suite runs
every case (tests/faults/test_fault_matrix.py); `scripts/dev/fault_matrix.py` runs them too and prints
the table kept in docs/reliability.md. Runs use the test MLP task (tests/framer_test_tasks.py): single
process in-process where the fault allows, real `python -m framer_ds` / `accelerate launch` processes
for signals, kills and the multi-rank cases.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml

from conftest import REPO, accelerate_launch_cmd, launch_env, mlp_config, read_metrics


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
    from accelerate.state import AcceleratorState, GradientState

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
            AcceleratorState._reset_state(reset_partial_state=True)
            GradientState._reset_state()
    return Result(rc, out.getvalue(), err.getvalue())


def start(cmd: list[str], **env: str) -> subprocess.Popen:
    """A real process in its own session (as Slurm runs a job step), output to pipes."""
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        env={**launch_env(), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def framer_ds(*argv: str) -> list[str]:
    return [sys.executable, "-m", "framer_ds", *argv]


def wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metrics = run_dir / "metrics.jsonl"
        if metrics.exists() and any(
            json.loads(line).get("step", 0) >= step
            for line in metrics.read_text().splitlines()
            if line.strip()
        ):
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early:\n{proc.communicate()[1][-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"step {step} not reached in {timeout} s")


def train_steps(run_dir: Path) -> list[int]:
    return [line["step"] for line in read_metrics(run_dir)[0]]


def mlp(tmp: Path, name: str = "run", **sections) -> tuple[Path, Path]:
    run_dir = tmp / name
    return mlp_config(tmp / f"{name}.yaml", run_dir, **sections), run_dir


# --- data loss and wrong timelines -------------------------------------------------------------------


@case(
    "resume from step_6 while step_8 exists, checkpoint every step, keep_last_checkpoints=1",
    "the new step_7 is kept; the abandoned step_7, step_8 and final/ move to checkpoints/abandoned/; "
    "`latest` picks the new step_7",
)
def rollback_resume_keeps_the_new_timeline(tmp: Path) -> str:
    config, run = mlp(tmp, train={"max_steps": 8, "checkpoint_every": 1, "keep_last_checkpoints": 10})
    assert cli("train", str(config)).rc == 0
    resumed = cli(
        "train",
        str(config),
        f"train.resume={run}/checkpoints/step_6",
        "train.max_steps=7",
        "train.keep_last_checkpoints=1",
    )
    assert resumed.rc == 0, resumed.err[-3000:]
    kept = sorted(p.name for p in (run / "checkpoints").glob("step_*"))
    assert kept == ["step_7"], kept
    (abandoned,) = (run / "checkpoints" / "abandoned").iterdir()
    assert sorted(p.name for p in abandoned.iterdir()) == ["final", "step_7", "step_8"]
    assert "holds the abandoned timeline" in resumed.out
    from framer_ds.engine.checkpoint import choose_resume, read_trainer_state

    latest = choose_resume(run, "latest").path
    assert latest == run / "checkpoints" / "step_7" and read_trainer_state(latest).global_step == 7
    assert train_steps(run) == [1, 2, 3, 4, 5, 6, 7]
    where = abandoned.relative_to(run)
    return f"checkpoints/ holds {kept}; {where} holds step_7, step_8, final/; latest = step_7"


@case(
    "the process dies between moving the old final/ aside and moving the new one in",
    "the old final/ survives (renamed aside), never neither; the next export removes the leftover",
)
def replacing_final_never_leaves_neither(tmp: Path) -> str:
    from framer_ds.storage import atomic

    config, run = mlp(tmp, train={"max_steps": 4, "checkpoint_every": 2})
    assert cli("train", str(config)).rc == 0
    old_weights = (run / "final" / "model.safetensors").read_bytes()
    real_replace = os.replace

    def crash_when_publishing_final(src, dst):
        if Path(dst).name == "final" and Path(src).name.startswith(".tmp_final"):
            raise OSError("simulated power loss between the two renames")
        real_replace(src, dst)

    atomic.os.replace = crash_when_publishing_final
    try:
        crashed = cli("train", str(config), "train.resume=latest", "train.max_steps=6")
    finally:
        atomic.os.replace = real_replace
    assert crashed.rc != 0
    (aside,) = run.glob(".old_final.*")
    assert (aside / "model.safetensors").read_bytes() == old_weights and not (run / "final").exists()
    again = cli("train", str(config), "train.resume=latest", "train.max_steps=6")
    assert again.rc == 0, again.err[-3000:]
    assert (run / "final" / "model.safetensors").is_file() and not list(run.glob(".old_final.*"))
    return f"after the crash: {aside.name}/ holds the old weights; the rerun published final/ and removed it"


@case(
    "the newest checkpoint is truncated; another holds a file that is not in its manifest",
    "`latest` skips step_8 naming the truncated file and resumes from step_4; an explicit "
    "train.resume of either is refused naming the file",
)
def damaged_checkpoints_are_named_and_skipped(tmp: Path) -> str:
    config, run = mlp(tmp, train={"max_steps": 8, "checkpoint_every": 4, "keep_last_checkpoints": 3})
    assert cli("train", str(config)).rc == 0
    step_4, step_8 = run / "checkpoints" / "step_4", run / "checkpoints" / "step_8"
    weights = step_8 / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    (step_4 / "evil.pkl").write_bytes(b"not written by the run")
    explicit = cli("train", str(config), f"train.resume={step_8}", "train.max_steps=10")
    assert explicit.rc == 1 and "model.safetensors" in explicit.err and "truncated" in explicit.err
    extra = cli("train", str(config), f"train.resume={step_4}", "train.max_steps=10")
    assert extra.rc == 1 and "evil.pkl is not in the manifest" in extra.err, extra.err[-2000:]
    (step_4 / "evil.pkl").unlink()
    latest = cli("train", str(config), "train.resume=latest", "train.max_steps=10")
    assert latest.rc == 0, latest.err[-3000:]
    assert "skipped step_8" in latest.out and f"resumed from {step_4}" in latest.out
    assert train_steps(run) == list(range(1, 11))
    return (
        "explicit resume refused (truncated model.safetensors; evil.pkl not in the manifest); "
        "latest skipped step_8 and resumed at step 4"
    )


@case(
    "the process dies while metrics.jsonl is cut back to the resume step",
    "metrics.jsonl keeps its whole history (the cut copy is written beside it and renamed)",
)
def metrics_rewrite_is_atomic(tmp: Path) -> str:
    from framer_ds.storage import atomic

    config, run = mlp(tmp, train={"max_steps": 4, "checkpoint_every": 2, "keep_last_checkpoints": 3})
    assert cli("train", str(config)).rc == 0
    before = (run / "metrics.jsonl").read_text()
    real_fsync = atomic.fsync_path

    def die_before_the_rename(path):
        if ".metrics." in Path(path).name:
            raise KeyboardInterrupt("simulated kill during the metrics rewrite")
        real_fsync(path)

    atomic.fsync_path = die_before_the_rename
    try:
        killed = cli("train", str(config), f"train.resume={run}/checkpoints/step_2")
    except KeyboardInterrupt:
        killed = Result(-1, "", "")
    finally:
        atomic.fsync_path = real_fsync
    assert killed.rc != 0
    assert (run / "metrics.jsonl").read_text() == before
    assert not [p for p in run.iterdir() if p.name.startswith(".metrics")]
    return f"metrics.jsonl unchanged ({len(before.splitlines())} lines), no temp file left"


# --- one writer per run directory --------------------------------------------------------------------


@case(
    "a second run starts on the output_dir of a live run (a requeue racing a manual restart)",
    "the second run fails at once naming the host and pid that hold the directory; the first finishes "
    "with every step logged once",
)
def a_second_run_is_refused(tmp: Path) -> str:
    config, run = mlp(tmp, data={"sleep_per_batch_s": 0.05}, train={"checkpoint_every": 4})
    first = start(framer_ds("train", str(config)))
    try:
        wait_for_step(run, 1, first)
        second = cli("train", str(config), "train.resume=latest")
        assert second.rc == 1, second.err[-2000:]
        assert f"pid {first.pid} on host" in second.err and "in use by" in second.err
    finally:
        _, err = first.communicate(timeout=240)
    assert first.returncode == 0, err[-3000:]
    assert train_steps(run) == list(range(1, 17))
    return f"second run: exit 1, 'in use by pid {first.pid} on host ...'; first run: 16 steps, each once"


@case(
    "a 2-process launch starts on the output_dir of a live run",
    "every rank stops before training with the holder named (rank 0 takes the lock, the others learn it)",
    multi_process=True,
)
def a_second_launch_is_refused_on_every_rank(tmp: Path) -> str:
    config, run = mlp(tmp, data={"sleep_per_batch_s": 1.0})  # alive for ~30 s: longer than a launch takes
    first = start(framer_ds("train", str(config)))
    try:
        wait_for_step(run, 1, first)
        cmd = accelerate_launch_cmd("--multi_gpu", "--num_processes", "2", "-m", "framer_ds", "train")
        second = subprocess.run(
            [*cmd, str(config), "train.resume=latest"],
            cwd=REPO,
            env=launch_env(),
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    assert second.returncode != 0
    assert f"pid {first.pid} on host" in second.stderr, second.stderr[-3000:]
    assert "rank 0 failed: RunDirLocked" in second.stderr  # rank 1 got rank 0's verdict
    return "launch exits non-zero; rank 0 names the holder, rank 1 reports rank 0's verdict"


# --- resume tells the truth --------------------------------------------------------------------------


@case(
    "resume with train.learning_rate halved",
    "applied (the LR curve continues at half) and logged as 'changed on resume'; config.yaml says so",
)
def a_new_learning_rate_is_applied(tmp: Path) -> str:
    config, run = mlp(tmp, train={"max_steps": 6, "checkpoint_every": 2, "keep_last_checkpoints": 5})
    assert cli("train", str(config)).rc == 0
    original = {line["step"]: line["lr"] for line in read_metrics(run)[0]}
    resumed = cli("train", str(config), f"train.resume={run}/checkpoints/step_2", "train.learning_rate=5e-4")
    assert resumed.rc == 0, resumed.err[-3000:]
    assert "changed on resume: train.learning_rate: 0.001 -> 0.0005" in resumed.out
    after = {line["step"]: line["lr"] for line in read_metrics(run)[0]}
    for step in (3, 4, 5, 6):
        assert abs(after[step] - original[step] / 2) <= 1e-12, (step, after[step], original[step])
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["learning_rate"] == 5e-4
    return f"lr at step 3: {original[3]:.3g} before, {after[3]:.3g} after; logged; config.yaml 0.0005"


@case(
    "resume with a new micro-batch size and a new data set size",
    "refused before training, both differences listed at once; nothing in the run directory changes",
)
def a_breaking_change_is_refused(tmp: Path) -> str:
    config, run = mlp(tmp, train={"max_steps": 4, "checkpoint_every": 2})
    assert cli("train", str(config)).rc == 0
    before = (run / "metrics.jsonl").read_text()
    refused = cli(
        "train", str(config), "train.resume=latest", "train.micro_batch_size=4", "data.num_samples=256"
    )
    assert refused.rc == 1
    assert "train.micro_batch_size: 8 in the checkpoint, 4 now" in refused.err, refused.err[-2000:]
    assert "data.num_samples: 512 in the checkpoint, 256 now" in refused.err
    assert (run / "metrics.jsonl").read_text() == before
    allowed = cli(
        "train",
        str(config),
        "train.resume=latest",
        "data.num_samples=256",
        "train.resume_allow_changes=[data.num_samples]",
        "train.max_steps=5",
    )
    assert allowed.rc == 0, allowed.err[-2000:]
    return "exit 1 listing train.micro_batch_size 8 -> 4 and data.num_samples 512 -> 256; allowed when listed"


@case(
    "a checkpoint's random_states_0.pkl is missing",
    "the run resumes and warns that it is no longer exactly reproducible",
)
def missing_rng_state_resumes_with_a_warning(tmp: Path) -> str:
    config, run = mlp(tmp, train={"max_steps": 4, "checkpoint_every": 2})
    assert cli("train", str(config)).rc == 0
    (run / "checkpoints" / "step_4" / "random_states_0.pkl").unlink()
    resumed = cli("train", str(config), "train.resume=latest", "train.max_steps=6")
    assert resumed.rc == 0, resumed.err[-3000:]
    assert "random_states_0.pkl is missing" in resumed.out and "no longer exactly reproducible" in resumed.out
    return "resumed at step 4 with: 'random_states_0.pkl is missing: ... no longer exactly reproducible'"


@case(
    "rank 1 cannot see the files rank 0 writes (output_dir on a node-local disk)",
    "the run stops before training: output_dir must be on a shared file system",
    multi_process=True,
)
def a_run_dir_that_is_not_shared_is_refused(tmp: Path) -> str:
    config, run = mlp(tmp)
    cmd = accelerate_launch_cmd(
        "--multi_gpu", "--num_processes", "2", "-m", "framer_ds", "train", str(config)
    )
    env = {**launch_env(), "FRAMER_TEST_BLIND_RANK": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0
    assert "ranks [1] do not see" in proc.stderr and "shared" in proc.stderr, proc.stderr[-3000:]
    assert not (run / "metrics.jsonl").exists()
    return "exit non-zero: 'ranks [1] do not see ... output_dir must be on a file system every node shares'"


# --- signals and process lifetime --------------------------------------------------------------------


@case(
    "SIGTERM while the run is still starting (building the data), then a requeue with resume=latest",
    "exit 75 with preempted.json (during start-up, no checkpoint); the requeued run starts from step 0",
)
def a_signal_during_start_up_can_be_requeued(tmp: Path) -> str:
    from framer_ds.train.faults import EXIT_PREEMPTED

    config, run = mlp(tmp, data={"startup_sleep_s": 60.0}, train={"max_steps": 4})
    proc = start(framer_ds("train", str(config), "train.resume=latest"))
    for line in proc.stdout:
        if "building datasets" in line:
            break
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_PREEMPTED, err[-3000:]
    assert time.monotonic() - signalled < 20, "the stop waited for the start-up to finish"
    marker = json.loads((run / "preempted.json").read_text())
    assert marker["during_startup"] is True and marker["checkpoint"] is None
    again = cli("train", str(config), "train.resume=latest", "data.startup_sleep_s=0.0")
    assert again.rc == 0, again.err[-3000:]
    assert train_steps(run) == [1, 2, 3, 4]
    took = time.monotonic() - signalled
    return f"exit {proc.returncode}, {took:.1f} s after SIGTERM; marker during_startup; requeue ran 4 steps"


def _stop_the_launcher_only(tmp: Path, sig: signal.Signals) -> str:
    config, run = mlp(tmp, data={"sleep_per_batch_s": 0.15})
    launcher = start(
        accelerate_launch_cmd("--multi_gpu", "--num_processes", "2", "-m", "framer_ds", "train", str(config))
    )
    wait_for_step(run, 2, launcher)
    ranks = [
        p
        for p in psutil.Process(launcher.pid).children(recursive=True)
        if "framer_ds" in " ".join(p.cmdline())
    ]
    assert len(ranks) == 2
    launcher.send_signal(sig)
    _, alive = psutil.wait_procs(ranks, timeout=90)
    for orphan in alive:
        orphan.kill()
    assert not alive, f"{len(alive)} rank(s) still running 90 s after the launcher got {sig.name}"
    _, err = launcher.communicate(timeout=30)  # the ranks wrote into the launcher's pipes
    # Each rank says why it stopped: its own signal, or "a stop signal on another rank" when the
    # other rank's came first.
    stopped = sorted({line.split(" after")[0] for line in err.splitlines() if line.startswith("stopped by")})
    own = [line for line in stopped if "another rank" not in line]
    assert own, err[-3000:]
    marker = json.loads((run / "preempted.json").read_text())
    assert Path(marker["checkpoint"]).is_dir() and marker["step"] >= 2
    return f"both ranks checkpointed step_{marker['step']} and exited ('{own[0]}')"


@case(
    "the launcher (`accelerate launch`) is SIGKILLed while 2 ranks train",
    "both ranks notice the dead parent, checkpoint the step in flight and exit; no orphan keeps running",
    multi_process=True,
)
def killing_the_launcher_leaves_no_orphans(tmp: Path) -> str:
    observed = _stop_the_launcher_only(tmp, signal.SIGKILL)
    assert "the launcher, pid" in observed and "died" in observed, observed
    return observed


@case(
    "SIGINT (Ctrl-C) to the launcher only, which passes it on to the ranks",
    "the ranks checkpoint the step in flight and exit 75 (they used to die with a KeyboardInterrupt)",
    multi_process=True,
)
def interrupting_the_launcher_checkpoints(tmp: Path) -> str:
    return _stop_the_launcher_only(tmp, signal.SIGINT)


@case(
    "--overwrite on a directory holding preempted.json, tensorboard/ and wandb/ from the old run",
    "none of them survive: the new run shows only its own curves and markers",
)
def overwrite_leaves_nothing_of_the_old_run(tmp: Path) -> str:
    config, run = mlp(tmp, train={"max_steps": 2}, log={"tensorboard": True})
    assert cli("train", str(config)).rc == 0
    (run / "preempted.json").write_text("{}")
    (run / "wandb" / "offline-run-old").mkdir(parents=True)
    fresh = cli("train", str(config), "--overwrite", "log.tensorboard=false")
    assert fresh.rc == 0, fresh.err[-2000:]
    left = sorted(p.name for p in run.iterdir() if not p.name.startswith("."))
    assert left == ["config.yaml", "final", "metrics.jsonl"], left
    return f"after --overwrite: {left}"


# --- values that are accepted but wrong --------------------------------------------------------------


@case(
    "output_dir: ~/runs/x, and a path with an unset $VARIABLE",
    "~ becomes the home directory (no directory named '~'); the unset variable is named in an error",
)
def paths_expand_home_and_variables(tmp: Path) -> str:
    config, _ = mlp(tmp, train={"max_steps": 1})
    with environment(HOME=str(tmp / "home")):
        ran = cli("train", str(config), "output_dir=~/runs/x")
    assert ran.rc == 0, ran.err[-2000:]
    assert (tmp / "home" / "runs" / "x" / "final").is_dir() and not any(tmp.rglob("~"))
    unset = cli("train", str(config), "output_dir=$FRAMER_TEST_NOT_SET/x")
    assert unset.rc == 1 and "environment variable FRAMER_TEST_NOT_SET" in unset.err
    return "~/runs/x -> $HOME/runs/x; $FRAMER_TEST_NOT_SET/x -> 'environment variable ... is not set'"


@case(
    "train.max_steps=true, train.epochs=2.5, log.tensorboard=1",
    "three type errors reported together; none silently coerced (true used to become 1)",
)
def wrong_types_are_errors(tmp: Path) -> str:
    config, _ = mlp(tmp)
    bad = cli("validate", str(config), "train.max_steps=true", "train.epochs=2.5", "log.tensorboard=1")
    assert bad.rc == 1
    for key in ("train.max_steps", "train.epochs", "log.tensorboard"):
        assert f"{key}: got" in bad.err, bad.err
    assert "3 problem(s)" in bad.err
    return "exit 1, '3 problem(s)': train.max_steps, train.epochs, log.tensorboard"


@case(
    "an accelerate YAML with num_processes 0 / 'two', gpu_ids that do not match, machine_rank out of range",
    "`framer-ds validate` names each value and what is allowed",
)
def launch_values_are_checked(tmp: Path) -> str:
    config, _ = mlp(tmp)
    seen = []
    for values, needle in (
        ({"num_processes": 0}, "num_processes: is 0"),
        ({"num_processes": "two"}, "num_processes: is 'two'"),
        ({"num_processes": 4, "gpu_ids": "0,1"}, "gpu_ids: lists 2 GPU(s) but num_processes 4"),
        (
            {"num_machines": 2, "machine_rank": 2, "num_processes": 2},
            "machine_rank: is 2 but num_machines is 2",
        ),
    ):
        accelerate = tmp / "accelerate.yaml"
        accelerate.write_text(yaml.safe_dump({"distributed_type": "MULTI_GPU", **values}))
        checked = cli("validate", str(config), "--accelerate-config", str(accelerate))
        assert checked.rc == 1 and needle in checked.err, (values, checked.err)
        seen.append(needle.split(":")[0])
    return f"refused: {', '.join(seen)}"
