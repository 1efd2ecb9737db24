"""Fault cases: what a run does with bad input and interruptions around its start (non-finite values,
signals in the first seconds, resuming past length.steps, a checkpoint without its manifest, a config
error found during start-up, an old preemption marker). The heartbeat-lock race is in test_run_lock.py."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from faults.harness import case, cli, framer_ds, mlp, run_with_checkpoints_at_4_and_8, train_steps

from conftest import start_process
from framer_ds.train.preemption import EXIT_PREEMPTED, PREEMPTED_MARKER

# --- values -------------------------------------------------------------------------------------------


@case(
    "train.optimizer.epsilon=1e400 (reads as inf) and train.optimizer.learning_rate=.nan",
    "both refused together as not finite, before anything is written (inf used to pass, train nothing "
    "and exit 0)",
)
def non_finite_floats_are_refused(tmp: Path) -> str:
    config, run = mlp(tmp)
    bad = cli("train", str(config), "train.optimizer.epsilon=1e400", "train.optimizer.learning_rate=.nan")
    assert bad.rc == 1, bad.err[-2000:]
    for key in ("train.optimizer.epsilon: got inf", "train.optimizer.learning_rate: got nan"):
        assert key in bad.err and "must be a finite number" in bad.err, bad.err
    assert not run.exists()
    return (
        "exit 1, '2 problem(s)': optimizer.epsilon got inf, optimizer.learning_rate got nan: must be finite"
    )


# --- resuming -----------------------------------------------------------------------------------------


@case(
    "the newest checkpoint's manifest.json was deleted, then resume=latest",
    "`latest` names step_8 as incomplete (no manifest) and resumes from the verified step_4; an explicit "
    "train.resume of step_8 is refused (it used to be taken as an unverified pre-0.2 checkpoint)",
)
def a_checkpoint_without_its_manifest_is_skipped(tmp: Path) -> str:
    config, run, step_4, step_8 = run_with_checkpoints_at_4_and_8(tmp)
    (step_8 / "manifest.json").unlink()
    explicit = cli("train", str(config), f"train.resume={step_8}", "train.length.steps=10")
    assert explicit.rc == 1 and "manifest.json is missing" in explicit.err, explicit.err[-2000:]
    latest = cli("train", str(config), "train.resume=latest", "train.length.steps=10")
    assert latest.rc == 0, latest.err[-3000:]
    skipped = next(line for line in latest.out.splitlines() if "skipped step_8" in line)
    assert "manifest.json is missing" in skipped and f"resumed from {step_4}" in latest.out, latest.out
    assert train_steps(run) == list(range(1, 11))
    return "explicit resume of step_8 refused; latest: 'skipped step_8: ... manifest.json is missing', step 4"


def _snapshot(run: Path) -> dict[str, bytes]:
    """Every file of a run directory with its content, except the lock a run takes while it is alive."""
    return {
        str(p.relative_to(run)): p.read_bytes()
        for p in sorted(run.rglob("*"))
        if p.is_file() and p.name != ".framer_ds.lock"
    }


@case(
    "resume=latest from a step_8 checkpoint with train.length.steps=6",
    "refused naming both numbers and the fix; nothing in the run directory changes (it used to export "
    "final/ labelled as trained to step 6 from step-8 weights)",
)
def resuming_past_max_steps_is_refused(tmp: Path) -> str:
    config, run = mlp(tmp, train={"length.steps": 8, "checkpoint.every.steps": 4})
    assert cli("train", str(config)).rc == 0
    before = _snapshot(run)
    short = cli("train", str(config), "train.resume=latest", "train.length.steps=6")
    assert short.rc == 1, short.err[-2000:]
    message = next(line for line in short.err.splitlines() if "train.length.steps" in line)
    assert "is 6" in message and "step 8" in message and "Set train.length.steps to 8 or more" in message
    assert _snapshot(run) == before
    return f"exit 1, '{message.strip().removeprefix('- ')[:90]}...'; run directory unchanged"


@case(
    "a config error found once the run has started (a training set smaller than a batch), then the "
    "corrected run on the same output_dir",
    "the error names the key; no config.yaml is left, so the corrected run starts (it used to be refused "
    "as 'already holds a run')",
)
def a_late_config_error_leaves_no_run_behind(tmp: Path) -> str:
    config, run = mlp(tmp)
    bad = cli("train", str(config), "data.num_samples=4")
    assert bad.rc == 1 and "train.micro_batch_size" in bad.err, bad.err[-2000:]
    left = sorted(p.name for p in run.iterdir() if not p.name.startswith("."))
    assert left == [], left
    fixed = cli("train", str(config))
    assert fixed.rc == 0, fixed.err[-2000:]
    assert train_steps(run) == list(range(1, 17))
    return "exit 1 naming train.micro_batch_size, output_dir left empty; the corrected run trained 16 steps"


@case(
    "a run stopped by a signal (preempted.json), resumed by hand with train.resume=PATH",
    "the resumed run removes the old preempted.json when it starts (a finished job used to keep it, and "
    "the Slurm script requeued it)",
)
def a_resumed_run_clears_the_old_preemption_marker(tmp: Path) -> str:
    config, run = mlp(tmp, train={"length.steps": 8, "checkpoint.every.steps": 4})
    assert cli("train", str(config)).rc == 0
    step_8 = run / "checkpoints" / "step_8"
    for resume in (str(step_8), "latest"):
        (run / PREEMPTED_MARKER).write_text(json.dumps({"step": 8, "signal": "SIGTERM"}))
        resumed = cli("train", str(config), f"train.resume={resume}", "train.length.steps=10")
        assert resumed.rc == 0, resumed.err[-2000:]
        assert not (run / PREEMPTED_MARKER).exists(), resume
    return "train.resume=PATH and train.resume=latest both removed preempted.json"


# --- signals ------------------------------------------------------------------------------------------


def _catches(pid: int, sig: signal.Signals) -> bool:
    """Whether process `pid` has a handler for `sig` (the SigCgt mask of /proc/PID/status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) >> (sig - 1) & 1)


def _torch_loaded(pid: int) -> bool:
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


@case(
    "SIGTERM or SIGUSR1 0.05, 0.3, 1 and 2 s after `python -m framer_ds train` was spawned (imports, "
    "config, start-up)",
    "exit 75 and preempted.json at every moment (it used to be 143, 138 or 1 and no marker, so Slurm did "
    "not requeue); the handler is in place before torch is imported",
)
def a_signal_at_any_moment_of_start_up_is_a_preemption(tmp: Path) -> str:
    delays = {0.05: signal.SIGTERM, 0.3: signal.SIGUSR1, 1.0: signal.SIGTERM, 2.0: signal.SIGUSR1}
    runs, procs, sent = {}, {}, {}
    for delay in delays:  # all at once: four start-ups on a busy machine, as a requeue storm would be
        config, runs[delay] = mlp(
            tmp, f"run_{delay}", data={"startup_sleep_s": 60.0}, train={"length.steps": 4}
        )
        procs[delay] = (
            start_process(framer_ds("train", str(config), "train.resume=latest")),
            time.monotonic(),
        )
    pending, handled_at = dict(delays), {}
    while pending:
        for delay, sig in list(pending.items()):
            proc, spawned = procs[delay]
            # Before the interpreter runs its first line nothing can catch a signal (tens of ms, more
            # on a busy machine): watch for the handler from the spawn on, and check it came before torch.
            if delay not in handled_at and _catches(proc.pid, sig):
                handled_at[delay] = time.monotonic() - spawned
                assert not _torch_loaded(proc.pid), f"torch was imported before the stop handler ({delay})"
            if delay in handled_at and time.monotonic() - spawned >= delay:
                proc.send_signal(sig)
                sent[delay] = time.monotonic() - spawned
                del pending[delay]
        time.sleep(0.005)
    seen = []
    for delay, sig in delays.items():
        proc, _ = procs[delay]
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == EXIT_PREEMPTED, (delay, proc.returncode, err[-3000:])
        marker = json.loads((runs[delay] / PREEMPTED_MARKER).read_text())
        assert marker["signal"] == sig.name and marker["during_startup"] is True, marker
        assert f"stopped by {sig.name} before training started" in err, err[-2000:]
        seen.append(f"{sig.name} at {sent[delay]:.2f} s")
    first = min(handled_at.values())
    return f"exit 75 + preempted.json for {', '.join(seen)} (handler in place {first:.2f} s after spawn)"
