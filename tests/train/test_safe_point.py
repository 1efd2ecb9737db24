"""A stop during the work a resumed run does first (what the previous stop put off) is answered the same
way: the rest is put off again, the step's checkpoint is written again with it, and nothing is lost.
(The single stops are fault cases: tests/faults/stop_cases.py.)"""

from __future__ import annotations

import json

from faults.harness import cli, environment, mlp, train_steps
from faults.stop_cases import OVERRIDES, SECTIONS, eval_steps, reference_run, same_numbers

from conftest import fp16_loss_scaler_on_cpu, read_metrics


def test_a_stop_during_the_put_off_work_puts_off_the_rest_again(tmp_path):
    config, run = mlp(tmp_path, **SECTIONS)
    with environment(FRAMER_TEST_SIGNAL="batch:8"):  # step 4: evaluate and samples put off
        assert cli("train", str(config), *OVERRIDES).rc == 75
    with environment(FRAMER_TEST_SIGNAL="eval:1"):  # during the put-off evaluation
        again = cli("train", str(config), *OVERRIDES, "train.resume=latest")
    assert again.rc == 75, again.err[-3000:]
    assert "step 4: first what the stop put off: evaluate, samples" in again.out + again.err
    state = json.loads((run / "checkpoints" / "step_4" / "trainer_state.json").read_text())
    assert state["deferred_actions"] == ["keep-best", "samples"], state
    assert state["deferred_eval"]["eval/loss"] == read_metrics(run)[1][0]["eval/loss"]
    assert train_steps(run) == [1, 2, 3, 4] and eval_steps(run) == [4]
    assert not (run / "best").exists() and not (run / "samples").exists()
    done = cli("train", str(config), *OVERRIDES, "train.resume=latest")
    assert done.rc == 0, done.err[-3000:]
    assert train_steps(run) == list(range(1, 9)) and eval_steps(run) == [4, 8]  # step 4 evaluated once
    same_numbers(run, reference_run(tmp_path))


def test_what_ran_before_the_stop_is_not_done_again(tmp_path):
    """A stop during step 4's best/ export: the export finishes, only the samples are put off, and the
    resumed run neither evaluates nor judges step 4 again (one eval line, one best/ line at step 4)."""
    config, run = mlp(tmp_path, **SECTIONS)
    with environment(FRAMER_TEST_SIGNAL="export:1"):
        assert cli("train", str(config), *OVERRIDES).rc == 75
    state = json.loads((run / "checkpoints" / "step_4" / "trainer_state.json").read_text())
    assert state["deferred_actions"] == ["samples"] and state["best_step"] == 4, state
    assert json.loads((run / "best" / "best.json").read_text())["step"] == 4
    assert cli("train", str(config), *OVERRIDES, "train.resume=latest").rc == 0
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "best/eval/loss" in x] == [4, 8]
    assert eval_steps(run) == [4, 8] and (run / "samples" / "step_4").is_dir()


def test_a_stop_during_a_skipped_window_is_answered_before_another_window(tmp_path):
    """A window whose update the loss scaler skips is a safe point too: a stop that arrives in it is
    answered by the checkpoint of the last trained step (with the data position past the skipped window),
    not after one more window trained (it used to checkpoint step 3). Micro-batch 6 ends window 3
    (accumulation 2) and overflows; the signal comes at that micro-batch."""
    config, run = mlp(
        tmp_path,
        data={"bad_grad_batches": [6]},
        train={"length.steps": 8, "optimizer.max_grad_norm": 0.0, "checkpoint.every": None},
    )
    with fp16_loss_scaler_on_cpu(), environment(FRAMER_TEST_SIGNAL="batch:6"):
        stopped = cli("train", str(config), "task=test_scripted_eval", "train.eval.every=null")
    assert stopped.rc == 75, stopped.err[-3000:]
    marker = json.loads((run / "preempted.json").read_text())
    assert marker["step"] == 2 and train_steps(run) == [1, 2], (marker, train_steps(run))
    state = json.loads((run / "checkpoints" / "step_2" / "trainer_state.json").read_text())
    assert (state["skipped_steps"], state["batches_in_epoch"]) == (1, 6), state
