"""Fault cases: one writer per run directory, a shared run directory, signals and launcher deaths."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
from faults.harness import case, cli, ddp_train_cmd, framer_ds, mlp, train_steps

from conftest import (
    REPO,
    accelerate_launch_cmd,
    launch_env,
    rank_processes,
    start_process,
    wait_for_step,
)

# --- one writer per run directory --------------------------------------------------------------------


@case(
    "a second run starts on the output_dir of a live run (a requeue racing a manual restart)",
    "the second run fails at once naming the host and pid that hold the directory; the first finishes "
    "with every step logged once",
)
def a_second_run_is_refused(tmp: Path) -> str:
    # ~10 s of training: the second run must start while the first still runs
    config, run = mlp(tmp, data={"sleep_per_batch_s": 0.3}, train={"checkpoint.every.steps": 4})
    first = start_process(framer_ds("train", str(config)))
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
    first = start_process(framer_ds("train", str(config)))
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


@case(
    "rank 1 cannot see the files rank 0 writes (output_dir on a node-local disk)",
    "the run stops before training: output_dir must be on a shared file system",
    multi_process=True,
)
def a_run_dir_that_is_not_shared_is_refused(tmp: Path) -> str:
    config, run = mlp(tmp)
    cmd = ddp_train_cmd(config)
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

    config, run = mlp(tmp, data={"startup_sleep_s": 60.0}, train={"length.steps": 4})
    proc = start_process(framer_ds("train", str(config), "train.resume=latest"))
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
    launcher = start_process(ddp_train_cmd(config))
    wait_for_step(run, 2, launcher)
    ranks = rank_processes(launcher)
    assert len(ranks) == 2
    launcher.send_signal(sig)
    _, alive = psutil.wait_procs(ranks, timeout=90)
    for orphan in alive:
        orphan.kill()
    assert not alive, f"{len(alive)} rank(s) still running 90 s after the launcher got {sig.name}"
    _, err = launcher.communicate(timeout=30)  # the ranks wrote into the launcher's pipes
    # Each rank says why it stopped: its own signal, or "a stop signal on another rank" when the
    # other rank's came first. The ranks share the pipe, so one rank's message may land on the same
    # line as the other's unfinished progress bar: search the text, not line starts.
    stopped = sorted(set(re.findall(r"(stopped by .+?) after", err)))
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
