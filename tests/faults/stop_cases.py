"""Fault cases: a stop signal is answered at the next safe point. The step or action in flight may
finish; no new training step, evaluation, `best/` export or sample round starts before the stop
checkpoint, and what the stop put off is done first when the run resumes.

The signal comes from inside the run (tests/framer_test_tasks.py `FRAMER_TEST_SIGNAL`): the process
sends itself SIGUSR1 at an exactly chosen micro-batch or evaluation, which an outside `kill` at a
chosen moment could only approximate."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from faults.harness import case, cli, ddp_train_cmd, environment, mlp, train_steps

from conftest import REPO, launch_env, read_metrics

# 8 optimizer steps of 2 micro-batches; evaluation, best/ and samples every 4 steps, no scheduled
# checkpoint: the only checkpoint before the end is the one the stop writes.
OVERRIDES = ("task=test_scripted_eval", "data.sample_every=4")
SECTIONS = {
    "train": {
        "length.steps": 8,
        "eval.every.steps": 4,
        "eval.best_metric": "eval/loss",
        "eval.best_mode": "min",
        "checkpoint.every": None,
    }
}


def eval_steps(run: Path) -> list[int]:
    return [line["step"] for line in read_metrics(run)[1]]


def _stopped_at(run: Path, step: int) -> dict:
    """The stop checkpoint's trainer state, after checking the run stopped there and nowhere later."""
    marker = json.loads((run / "preempted.json").read_text())
    assert marker["step"] == step and Path(marker["checkpoint"]).name == f"step_{step}", marker
    assert train_steps(run) == list(range(1, step + 1)), train_steps(run)  # no new step started
    assert not (run / "samples" / f"step_{step}").exists() and not (run / "best").exists()
    return json.loads((run / "checkpoints" / f"step_{step}" / "trainer_state.json").read_text())


def _resume_and_compare(config: Path, run: Path, reference: Path) -> None:
    """The resumed run does what the stop put off, once, and ends where the uninterrupted run ends."""
    resumed = cli("train", str(config), *OVERRIDES, "train.resume=latest")
    assert resumed.rc == 0, resumed.err[-3000:]
    assert train_steps(run) == list(range(1, 9)) and eval_steps(run) == [4, 8]
    same_numbers(run, reference)
    assert sorted(p.name for p in (run / "samples").iterdir()) == ["step_4", "step_8"]
    assert json.loads((run / "best" / "best.json").read_text()) == json.loads(
        (reference / "best" / "best.json").read_text()
    )


def same_numbers(run: Path, reference: Path) -> None:
    """Every loss and eval value of `run` equals `reference`'s (the resume restores weights and RNG
    exactly, so the arithmetic is the same; wall times and rates differ)."""
    keys = ("step", "loss", "eval/loss")
    pick = [[{k: line[k] for k in keys if k in line} for line in part] for part in read_metrics(run)]
    want = [[{k: line[k] for k in keys if k in line} for line in part] for part in read_metrics(reference)]
    assert pick == want


def reference_run(tmp: Path) -> Path:
    config, run = mlp(tmp, "reference", **SECTIONS)
    assert cli("train", str(config), *OVERRIDES).rc == 0
    return run


@case(
    "SIGUSR1 during optimizer step 4, whose due actions are an evaluation, a `best/` export and samples "
    "(test_scripted_eval, eval and samples every 4 steps)",
    "step 4 finishes and is checkpointed at once: no eval line, no best/, no samples/step_4 before exit "
    "75 (they all used to run first); the resumed run evaluates, exports best/ and samples at step 4 "
    "first, and its losses and evaluations equal an uninterrupted run's",
)
def a_stop_during_a_step_skips_its_evaluation_and_samples(tmp: Path) -> str:
    config, run = mlp(tmp, **SECTIONS)
    with environment(FRAMER_TEST_SIGNAL="batch:8"):  # step 4's last micro-batch (accumulation 2)
        stopped = cli("train", str(config), *OVERRIDES)
    assert stopped.rc == 75, stopped.err[-3000:]
    state = _stopped_at(run, 4)
    assert eval_steps(run) == [] and state["deferred_actions"] == ["evaluate", "samples"], state
    _resume_and_compare(config, run, reference_run(tmp))
    return (
        "exit 75 at step 4 with evaluate and samples put off; the resume did them first and equals a run "
        "never stopped"
    )


@case(
    "SIGUSR1 during the evaluation at step 4 (before its `best/` export and samples)",
    "the evaluation finishes and is logged; best/ and samples/step_4 are put off, step 4 is checkpointed "
    "and no step 5 starts (step 5 used to run whole, after best/ and samples); the resume exports best/ "
    "from the logged evaluation without evaluating again",
)
def a_stop_during_an_evaluation_skips_best_and_samples(tmp: Path) -> str:
    config, run = mlp(tmp, **SECTIONS)
    with environment(FRAMER_TEST_SIGNAL="eval:1"):
        stopped = cli("train", str(config), *OVERRIDES)
    assert stopped.rc == 75, stopped.err[-3000:]
    state = _stopped_at(run, 4)
    assert eval_steps(run) == [4] and state["deferred_actions"] == ["keep-best", "samples"], state
    assert state["deferred_eval"]["eval/loss"] == read_metrics(run)[1][0]["eval/loss"]
    _resume_and_compare(config, run, reference_run(tmp))
    return "exit 75 at step 4 after its evaluation; keep-best and samples put off and done by the resume"


@case(
    "SIGUSR1 reaches rank 1 only, during the evaluation at step 4 (DDP, 2 processes)",
    "both ranks agree before the next action: neither starts the best/ export or samples, both "
    "checkpoint step 4 together and stop (no hang, no step 5)",
    multi_process=True,
)
def a_stop_on_one_rank_is_agreed_before_any_action(tmp: Path) -> str:
    config, run = mlp(tmp, **SECTIONS)
    proc = subprocess.run(
        ddp_train_cmd(config, *OVERRIDES),
        cwd=REPO,
        env={**launch_env(), "FRAMER_TEST_SIGNAL": "eval:1", "FRAMER_TEST_SIGNAL_RANK": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert "stopped by SIGUSR1 after step 4" in proc.stderr, proc.stderr[-3000:]
    assert "stopped by a stop signal on another rank after step 4" in proc.stderr, proc.stderr[-3000:]
    state = _stopped_at(run, 4)
    assert state["deferred_actions"] == ["keep-best", "samples"], state
    return "both ranks: 'stopped by ... after step 4; checkpoint written'; best/ and samples put off"


@case(
    "SIGUSR1 while the scheduled checkpoint of step 2 is being written",
    "that checkpoint answers the stop: exit 75 right after it, no step 3 (step 3 used to run whole and "
    "write a second checkpoint)",
)
def a_stop_during_a_checkpoint_is_answered_by_it(tmp: Path) -> str:
    config, run = mlp(tmp, train={"length.steps": 8, "checkpoint.every.steps": 2})
    with environment(FRAMER_TEST_SIGNAL="checkpoint:1"):
        stopped = cli("train", str(config), "task=test_scripted_eval")
    assert stopped.rc == 75, stopped.err[-3000:]
    marker = json.loads((run / "preempted.json").read_text())
    assert marker["step"] == 2 and train_steps(run) == [1, 2], (marker, train_steps(run))
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_2"]
    return "exit 75 after the step_2 checkpoint it interrupted; no step 3"
