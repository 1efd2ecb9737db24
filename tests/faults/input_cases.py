"""Fault cases: input that is not what it seems: a config that sets a key twice, another task's
checkpoint in a run's checkpoints/."""

from __future__ import annotations

from pathlib import Path

from faults.harness import case, cli, mlp, train_steps

# --- a key set twice ---------------------------------------------------------------------------------


@case(
    "the training YAML has a second `train:` block (a pasted snippet) and repeats `learning_rate`; the "
    "accelerate YAML repeats `num_processes`",
    "refused before any work, every repeat named with both of its lines, all at once (YAML kept the "
    "second block silently: the run trained 64 steps, the default, instead of 2); `validate` "
    "names the accelerate YAML's repeat",
)
def a_key_set_twice_is_refused(tmp: Path) -> str:
    run = tmp / "run"
    config = tmp / "twice.yaml"
    config.write_text(
        "imports: [framer_test_tasks]\n"  # line 1
        "task: test_mlp_regression\n"
        f"output_dir: {run}\n"
        "train:\n"  # line 4
        "  length: {steps: 2}\n"
        "  optimizer:\n"
        "    learning_rate: 0.01\n"  # line 7
        "    learning_rate: 0.001\n"  # line 8
        "train:\n"  # line 9
        "  seed: 3\n"
        "model: {}\n"
        "data: {}\n"
    )
    refused = cli("train", str(config))
    assert refused.rc == 1, refused.err[-2000:]
    lines = [line.strip() for line in refused.err.strip().splitlines()]
    assert lines[0] == f"error: 2 problem(s) in {config}:", lines
    assert lines[1].startswith(f"- {config}: train.optimizer.learning_rate: set twice, on lines 7 and 8")
    assert lines[2].startswith(f"- {config}: train: set twice, on lines 4 and 9"), lines
    assert len(lines) == 3 and not run.exists()
    accelerate = tmp / "accelerate.yaml"
    accelerate.write_text(
        "compute_environment: LOCAL_MACHINE\nnum_processes: 2\nuse_cpu: true\nnum_processes: 4\n"
    )
    fixed = tmp / "fixed.yaml"
    fixed.write_text(
        config.read_text().replace("    learning_rate: 0.01\n", "").replace("train:\n  seed", "  seed")
    )
    checked = cli("validate", str(fixed), "--accelerate-config", str(accelerate))
    assert checked.rc == 1 and f"{accelerate}: num_processes: set twice, on lines 2 and 4" in checked.err, (
        checked.out + checked.err
    )
    return (
        "exit 1 before any work: 'train: set twice, on lines 4 and 9' (+ learning_rate, 7 and 8); "
        "validate: 'num_processes: set twice, on lines 2 and 4'"
    )


# --- another task's checkpoint -----------------------------------------------------------------------


@case(
    "the run directory holds a test_mlp_regression checkpoint and test_token_regression is started in it "
    "with train.resume=latest (also with every key allowed to change, and with train.resume=PATH from "
    "another directory)",
    "one line naming both tasks and where to train instead; no list of config differences, nothing "
    "loaded or written (was a list of every model/data key with a hint to allow them, which led to a "
    "state-dict traceback)",
)
def another_tasks_checkpoint_is_refused(tmp: Path) -> str:
    config, run = mlp(tmp, train={"length.steps": 2, "checkpoint.every.steps": 2})
    assert cli("train", str(config)).rc == 0
    before = (run / "metrics.jsonl").read_text()
    other = ["task=test_token_regression", "train.resume=latest"]
    seen = []
    for extra in ([], ["train.resume_allow_changes=[task, model, data]"]):
        refused = cli("train", str(config), *other, *extra)
        lines = refused.err.strip().splitlines()
        assert refused.rc == 1 and len(lines) == 1, refused.err[-3000:]
        assert (
            "was written by task 'test_mlp_regression' but this run is task 'test_token_regression'"
            in (lines[0])
        )
        assert "in another output_dir" in lines[0] and "resume_allow_changes" not in lines[0]
        seen.append(lines[0])
    elsewhere = cli(
        "train",
        str(config),
        "task=test_token_regression",
        f"output_dir={tmp / 'token'}",
        f"train.resume={run / 'checkpoints' / 'step_2'}",
    )
    assert elsewhere.rc == 1 and len(elsewhere.err.strip().splitlines()) == 1, elsewhere.err[-3000:]
    assert "point train.resume at a checkpoint of a 'test_token_regression' run" in elsewhere.err
    assert (run / "metrics.jsonl").read_text() == before and train_steps(run) == [1, 2]
    return f"exit 1, one line: '{seen[0].removeprefix('error: ').split(';')[0]}'"
