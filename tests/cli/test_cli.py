"""The `framer-ds` CLI end to end: commands, exit codes, the message for each kind of bad input, the
run-directory contract, trackers and gradient checkpointing. In-process through `main(argv)`, plus a
few real subprocesses (`python -m framer_ds`) for the real exit codes and stderr."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from PIL import Image

from conftest import reset_accelerate
from framer_ds.cli.main import main

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = str(REPO / "configs" / "quickstart.yaml")


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Run `framer-ds ARGV` in-process: (exit code, stdout, stderr)."""
    try:
        rc = main(list(argv))
    finally:
        if argv and argv[0] == "train":  # between two in-process trainings in one test
            reset_accelerate()
    out, err = capsys.readouterr()
    return rc, out, err


def run_module(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """`python -m framer_ds ARGV` as a real process."""
    return subprocess.run(
        [sys.executable, "-m", "framer_ds", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def png(path: Path, value: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("L", (8, 8), value).save(path)
    return path


def image_folder(root: Path, train: dict[str, int], val: dict[str, int]) -> Path:
    """ROOT/{train,val}/CLASS/i.png with the given image count per class (0 = empty class dir)."""
    for split, counts in (("train", train), ("val", val)):
        for name, count in counts.items():
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                png(root / split / name / f"{i}.png", 40 * i)
    return root


def train_args(overrides: list[str], *extra: str) -> list[str]:
    return ["train", QUICKSTART, *overrides, *extra]


def on_folder(root: Path) -> list[str]:
    return ["data.source.builtin=null", f"data.source.path={root}", "train.micro_batch_size=2"]


# --- commands -------------------------------------------------------------------------------------


def test_help_lists_the_commands_as_python_dash_m():
    proc = run_module("--help")
    assert proc.returncode == 0, proc.stderr
    for command in ("train", "validate", "tasks"):
        assert command in proc.stdout
    assert proc.stdout.startswith("usage: framer-ds")


def test_in_process_help_is_the_same_parser(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert all(command in out for command in ("train", "validate", "tasks"))


def test_no_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


def test_tasks_lists_vit_classification_with_its_summary(capsys):
    from framer_ds.tasks.vit_classification.task import VitClassificationTask

    rc, out, _ = cli(capsys, "tasks")
    assert rc == 0
    lines = [line for line in out.splitlines() if line.startswith("vit_classification")]
    assert len(lines) == 1
    assert VitClassificationTask.summary in lines[0]
    assert "ImageFolder" in lines[0]


# --- validate -------------------------------------------------------------------------------------


def test_validate_good_config(capsys):
    rc, out, err = cli(capsys, "validate", QUICKSTART, "train.length.steps=20")
    assert rc == 0, err
    assert out.startswith("OK: ") and "task vit_classification" in out


def test_validate_a_shipped_recipe_on_the_users_own_videos(tmp_path, capsys):
    """The most common override: a shipped recipe pointed at one's own folder. `data.source.path` replaces
    the recipe's builtin (it was refused as "path and builtin both set"); the folder's clips are checked."""
    from framer_ds.tasks.video_lora.data.synthetic_video import ensure_synthetic_clips

    clips = ensure_synthetic_clips(tmp_path / "my_videos", count=2, frames=8)
    tiny = str(REPO / "configs" / "tasks" / "video_lora" / "tiny.yaml")
    rc, out, err = cli(capsys, "validate", tiny, f"data.source.path={clips}")
    assert rc == 0, err
    assert out.startswith("OK: ") and "task video_lora" in out


def test_validate_bad_config_as_a_real_process(tmp_path):
    """Every problem on stderr, exit 1, no traceback, nothing on stdout."""
    proc = run_module(
        "validate", "configs/quickstart.yaml", "train.micro_batch_siz=3", "train.mixed_precision=bf61"
    )
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.startswith("error: 2 problem(s) in configs/quickstart.yaml:\n"), proc.stderr
    assert "train.micro_batch_siz: unknown key. Did you mean 'micro_batch_size'" in proc.stderr
    assert "train.mixed_precision: got 'bf61'" in proc.stderr


def test_validate_bad_config_in_process(capsys):
    rc, out, err = cli(capsys, "validate", QUICKSTART, "train.gradient_acumulation_steps=4")
    assert rc == 1 and out == ""
    assert "Did you mean 'gradient_accumulation_steps'?" in err


def test_validate_conflicting_deepspeed_json_names_every_problem(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    ds = json.loads((REPO / "configs" / "deepspeed" / "zero2.json").read_text())
    ds["gradient_accumulation_steps"] = 4
    ds["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-4}}
    bad_json = tmp_path / "bad_zero2.json"
    bad_json.write_text(json.dumps(ds))
    rc, out, err = cli(
        capsys,
        "validate",
        "configs/quickstart.yaml",
        "--accelerate-config",
        "configs/accelerate_cpu_2proc.yaml",
        "--deepspeed-config",
        str(bad_json),
    )
    assert rc == 1 and out == ""
    assert "2 problem(s)" in err
    assert f"{bad_json}: gradient_accumulation_steps: is 4, which overrides train." in err
    assert f"{bad_json}: optimizer: delete the optimizer block" in err


# --- bad input: each a clear message and exit 1 ---------------------------------------------------


def test_missing_data_directory(quickstart_overrides, tmp_path, capsys):
    missing = tmp_path / "no_such_data"
    rc, _, err = cli(capsys, *train_args(quickstart_overrides, *on_folder(missing)))
    assert rc == 1
    assert f"data.source.path: {missing} does not exist" in err
    assert "ROOT/train/CLASS/*.png" in err and "ROOT/val/CLASS/*.png" in err


def test_image_folder_without_images(quickstart_overrides, tmp_path, capsys):
    root = image_folder(tmp_path / "data", train={"cat": 0, "dog": 0}, val={"cat": 0, "dog": 0})
    rc, _, err = cli(capsys, *train_args(quickstart_overrides, *on_folder(root)))
    assert rc == 1
    assert "4 problem(s)" in err, err
    assert f"{root / 'train' / 'cat'}: class directory has no images" in err
    assert f"{root / 'val' / 'dog'}: class directory has no images" in err


def test_image_folder_without_class_directories(quickstart_overrides, tmp_path, capsys):
    root = tmp_path / "data"
    png(root / "train" / "loose.png")
    (root / "val").mkdir()
    rc, _, err = cli(capsys, *train_args(quickstart_overrides, *on_folder(root)))
    assert rc == 1
    assert f"{root / 'train'}: train/ has no class directories. It holds 1 image(s) directly" in err
    assert f"{root / 'val'}: val/ has no class directories." in err


def test_class_missing_from_val(quickstart_overrides, tmp_path, capsys):
    root = image_folder(tmp_path / "data", train={"cat": 2, "dog": 2}, val={"cat": 2})
    rc, _, err = cli(capsys, *train_args(quickstart_overrides, *on_folder(root)))
    assert rc == 1
    assert "1 problem(s)" in err, err
    assert f"{root / 'val' / 'dog'}: class 'dog' has a train/ directory but no val/ directory" in err


def test_corrupt_image_is_named_with_verify_files(quickstart_overrides, tmp_path, capsys):
    root = image_folder(tmp_path / "data", train={"cat": 2, "dog": 2}, val={"cat": 2, "dog": 2})
    bad = root / "val" / "dog" / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n this is not an image")
    rc, _, err = cli(capsys, *train_args(quickstart_overrides, *on_folder(root), "data.verify_files=true"))
    assert rc == 1
    assert "1 problem(s)" in err, err
    assert f"{bad}: PIL cannot read this image" in err
    assert "Delete the file or replace it" in err


def test_unknown_task_suggests_the_registered_one(quickstart_overrides, capsys):
    rc, _, err = cli(capsys, *train_args(quickstart_overrides, "task=vit_clasification"))
    assert rc == 1
    assert "task: unknown task 'vit_clasification'. Did you mean 'vit_classification'?" in err


@pytest.mark.parametrize(("command", "serving"), [("tracks", "video_lora"), ("encode-audio", "tts_lm")])
def test_a_task_specific_data_command_on_another_task_names_its_tasks(capsys, command, serving):
    """`framer-ds data tracks` on the quickstart (vit_classification) used to end in a TypeError."""
    rc, _, err = cli(capsys, "data", command, QUICKSTART)
    assert rc == 1
    assert f"`framer-ds data {command}` serves the task(s) {serving}" in err, err
    assert "'vit_classification'" in err and "Traceback" not in err


def test_pretrained_path_without_config_json(quickstart_overrides, tmp_path, capsys):
    not_a_model = tmp_path / "downloads" / "vit"
    not_a_model.mkdir(parents=True)
    (not_a_model / "model.safetensors").write_bytes(b"")
    rc, _, err = cli(
        capsys,
        *train_args(quickstart_overrides, "model.source.config=null", f"model.source.path={not_a_model}"),
    )
    assert rc == 1
    assert f"model.source.path: {not_a_model} is not a saved model directory" in err
    assert "no config.json" in err and "huggingface-cli download" in err
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_misspelled_vit_config_field(quickstart_overrides, capsys):
    rc, _, err = cli(capsys, *train_args(quickstart_overrides, "model.source.config.hiden_size=8"))
    assert rc == 1
    assert "model.source.config.hiden_size: not a ViTConfig field. Did you mean 'hidden_size'" in err


def test_existing_run_is_refused_then_overwrite_then_resume(quickstart_overrides, tmp_path, capsys):
    run = tmp_path / "run"
    first = train_args(quickstart_overrides, "train.length.steps=1")
    rc, out, err = cli(capsys, *first)
    assert rc == 0, err
    metrics_before = (run / "metrics.jsonl").read_bytes()
    config_before = (run / "config.yaml").read_bytes()
    weights_mtime = (run / "final" / "model.safetensors").stat().st_mtime_ns

    rc, out, err = cli(capsys, *first)  # the same command again
    assert rc == 1
    assert f"output_dir: {run} already holds a run" in err
    assert "train.resume=latest" in err and "overwrite_output_dir=true" in err
    assert (run / "metrics.jsonl").read_bytes() == metrics_before
    assert (run / "config.yaml").read_bytes() == config_before
    assert (run / "final" / "model.safetensors").stat().st_mtime_ns == weights_mtime

    with_checkpoints = train_args(
        quickstart_overrides, "train.length.steps=2", "train.checkpoint.every.steps=1"
    )
    rc, out, err = cli(capsys, *with_checkpoints, "--overwrite")
    assert rc == 0, err
    assert "done: 2 steps" in out
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "loss" in x] == [1, 2]  # started over, not appended to the first run
    assert [x["step"] for x in lines if "run_summary" in x] == [0]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_1", "step_2"]

    rc, out, err = cli(
        capsys,
        *train_args(
            quickstart_overrides,
            "train.length.steps=3",
            "train.checkpoint.every.steps=1",
            "train.resume=latest",
        ),
    )
    assert rc == 0, err
    assert f"resumed from {run / 'checkpoints' / 'step_2'} at step 2" in out
    assert "done: 3 steps" in out
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "loss" in x] == [1, 2, 3]


def test_a_data_error_leaves_no_run_behind(quickstart_overrides, tmp_path, capsys):
    root = image_folder(tmp_path / "data", train={"cat": 2, "dog": 2}, val={"cat": 2})
    args = train_args(quickstart_overrides, *on_folder(root), "train.length.steps=1")
    rc, _, err = cli(capsys, *args)
    assert rc == 1 and "class 'dog' has a train/ directory but no val/" in err
    image_folder(root, train={}, val={"dog": 2})  # the user fixes the data and reruns
    rc, _, err = cli(capsys, *args)
    assert rc == 0, err


def test_resume_latest_without_a_checkpoint_does_not_clobber_the_run(quickstart_overrides, tmp_path, capsys):
    run = tmp_path / "run"
    rc, _, err = cli(capsys, *train_args(quickstart_overrides, "train.length.steps=2"))
    assert rc == 0, err
    before = (run / "metrics.jsonl").read_bytes()
    rc, _, err = cli(capsys, *train_args(quickstart_overrides, "train.length.steps=1", "train.resume=latest"))
    assert (run / "metrics.jsonl").read_bytes() == before
    assert rc == 1 and "checkpoint" in err


# --- successful runs ------------------------------------------------------------------------------


def test_quickstart_three_steps_writes_the_run_directory(quickstart_overrides, tmp_path, capsys):
    from framer_ds.tasks.run_config import load_run_config

    run = tmp_path / "run"
    rc, out, err = cli(capsys, *train_args(quickstart_overrides, "train.length.steps=3"))
    assert rc == 0, err
    done = [line for line in out.splitlines() if line.startswith("done:")]
    assert done == [done[0]] and done[0].startswith("done: 3 steps, eval/accuracy=")
    assert done[0].endswith(f"outputs in {run}")
    assert load_run_config(run / "config.yaml").train.length.steps == 3
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "loss" in x] == [1, 2, 3]
    assert any("eval/accuracy" in x for x in lines)
    assert (run / "final" / "model.safetensors").stat().st_size > 0
    exported = json.loads((run / "final" / "config.json").read_text())
    assert exported["model_type"] == "vit" and len(exported["id2label"]) == 10
    assert not (run / "checkpoints").exists()  # checkpoint.every=null


@pytest.fixture
def network_trap(monkeypatch):
    """Point W&B's API and every HTTP(S) proxy at a local socket that records connections: an
    offline run must never try to reach wandb.ai (or anything else)."""
    hits: list[tuple] = []
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, addr = server.accept()
            except (TimeoutError, OSError):
                continue
            hits.append(addr)
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    trap = f"http://127.0.0.1:{server.getsockname()[1]}"
    monkeypatch.setenv("WANDB_BASE_URL", trap)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)  # the config alone must make it offline
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(var, trap)
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    yield hits
    stop.set()
    thread.join(timeout=2)
    server.close()


def test_wandb_offline_and_tensorboard_through_accelerate(
    quickstart_overrides, tmp_path, capsys, network_trap
):
    run = tmp_path / "run"
    rc, _, err = cli(
        capsys,
        *train_args(
            quickstart_overrides,
            "train.length.steps=2",
            "log.wandb.offline=true",
            "log.wandb.project=test",
            "log.tensorboard=true",
        ),
    )
    assert rc == 0, err
    offline_runs = list((run / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 1, sorted(p.name for p in (run / "wandb").iterdir())
    assert list(offline_runs[0].glob("run-*.wandb")), "the offline run holds no .wandb log"
    events = list((run / "tensorboard").rglob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    assert network_trap == [], f"the offline run opened {len(network_trap)} network connection(s)"


@pytest.mark.parametrize("enabled", [True, False], ids=["checkpointing", "control"])
def test_gradient_checkpointing_really_checkpoints(quickstart_overrides, capsys, monkeypatch, enabled):
    """Count calls of the checkpoint function transformers installs on every ViT layer during the
    2 training steps; the control run (flag off) must make none, so the spy itself is sound."""
    from framer_ds.tasks.vit_classification.task import VitClassificationTask

    calls = {"checkpoint": 0, "layers": 0}
    flags = {}
    original = VitClassificationTask.build_model

    def spy_build_model(self):
        model = original(self)
        flags["is_checkpointing"] = any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
        for module in model.modules():
            func = getattr(module, "_gradient_checkpointing_func", None)
            if func is None:
                continue
            calls["layers"] += 1

            def counted(*args, _func=func, **kwargs):
                calls["checkpoint"] += 1
                return _func(*args, **kwargs)

            module._gradient_checkpointing_func = counted
        return model

    monkeypatch.setattr(VitClassificationTask, "build_model", spy_build_model)
    rc, _, err = cli(
        capsys,
        *train_args(
            quickstart_overrides,
            "train.length.steps=2",
            f"train.gradient_checkpointing={str(enabled).lower()}",
        ),
    )
    assert rc == 0, err
    assert flags["is_checkpointing"] is enabled
    if enabled:
        # 4 encoder layers (quickstart) x 2 micro-batch forwards, at least.
        assert calls["checkpoint"] >= 4 * 2, calls
    else:
        assert calls["checkpoint"] == 0, calls


def test_train_help_explains_overrides_and_where_every_key_is(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "train.length.steps=20" in out and "framer-ds config show TASK" in out and "docs/config.md" in out


def test_config_show_lists_every_key_with_default_and_description(capsys):
    assert main(["config", "show", "vit_classification"]) == 0
    out = capsys.readouterr().out
    assert "train.eval.every.epochs: float | null = null" in out and "data.val_fraction" in out
    assert main(["config", "show", "vit_clasification"]) == 1
    assert "Did you mean 'vit_classification'" in capsys.readouterr().err


class _WriteRecorder:
    """stderr as an unbuffered launcher gives it to a rank: every `write` reaches the pipe on its own."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_an_error_line_is_one_write(tmp_path, monkeypatch):
    """Two ranks failing together wrote 'error: ...' and its newline separately, so their lines ran
    together on the launch's stderr ('... start a new runerror: ...'); each line is now one write."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(Path(QUICKSTART).read_text() + "\nnot_a_key: 1\n")
    recorder = _WriteRecorder()
    monkeypatch.setattr(sys, "stderr", recorder)
    assert main(["validate", str(bad)]) == 1
    errors = [w for w in recorder.writes if w.startswith("error: ")]
    assert len(errors) == 1 and errors[0].endswith("\n") and "not_a_key" in errors[0]
