"""`framer-ds sample EXPORT_DIR [task options]`: the task recorded in the export decides the options
and the output (video_lora's mp4 is covered in test_video_lora.py; here vit_classification's labels,
the dispatch, and exports it cannot use)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForImageClassification

from conftest import REPO, train_in_process
from framer_ds.cli.main import main
from framer_ds.engine.export import EXPORT_RECORD
from framer_ds.tasks.run_config import load_run_config
from framer_ds.tasks.vit_classification.image_folder import ImageFolderDataset
from framer_ds.tasks.vit_classification.task import VitClassificationTask


@pytest.fixture(scope="module")
def vit_final(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("vit") / "run"
    overrides = [
        f"output_dir={run_dir}",
        "train.length.steps=120",
        "train.eval.every=null",
        "train.eval.max_batches=2",
    ]
    train_in_process(REPO / "configs" / "quickstart.yaml", overrides)
    return run_dir / "final"


def val_images(final: Path, count: int) -> list[Path]:
    config = load_run_config(final.parent / "config.yaml")
    root = VitClassificationTask(config).data_root()
    return sorted((root / "val").glob("*/*.png"))[:count]


def test_final_records_the_task_and_the_resolved_config(vit_final):
    record = json.loads((vit_final / EXPORT_RECORD).read_text())
    assert record["task"] == "vit_classification"
    assert record["config"]["train"]["length"] == {"steps": 120}
    assert record["config"] == json.loads(
        json.dumps(load_run_config(vit_final.parent / "config.yaml").model_dump(mode="json"))
    )


def test_vit_sample_prints_the_top_labels_the_model_predicts(vit_final, capsys):
    images = val_images(vit_final, 3)
    assert (
        main(["sample", str(vit_final), "--image", *map(str, images), "--top-k", "2", "--device", "cpu"]) == 0
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3
    model = AutoModelForImageClassification.from_pretrained(vit_final).eval()
    task = VitClassificationTask(load_run_config(vit_final.parent / "config.yaml"))
    dataset = ImageFolderDataset([(p, 0) for p in images], task.image_transform(model.config, train=False))
    for index, (path, line) in enumerate(zip(images, lines, strict=True)):
        with torch.no_grad():
            probabilities = model(pixel_values=dataset[index]["pixel_values"][None]).logits.softmax(-1)[0]
        best = int(probabilities.argmax())
        name, rest = line.split(": ", 1)
        assert name == str(path)
        first, second = rest.split(", ")
        assert first == f"{model.config.id2label[best]} {float(probabilities[best]):.3f}"
        assert len(second.split()) == 2


def test_sample_help_lists_the_task_options(vit_final, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["sample", str(vit_final), "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--image" in out and "--top-k" in out and "(default: 5)" in out and "vit_classification" in out


def test_sample_option_errors_name_the_flag(vit_final, capsys, tmp_path):
    image = val_images(vit_final, 1)[0]
    assert main(["sample", str(vit_final), "--image", str(image), "--top-k", "0"]) == 1
    assert "--top-k" in capsys.readouterr().err
    assert main(["sample", str(vit_final), "--image", str(tmp_path / "missing.png")]) == 1
    assert "missing.png" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a required option is missing: argparse's usage error
        main(["sample", str(vit_final)])
    assert "--image" in capsys.readouterr().err


def test_an_export_without_a_record_is_named(tmp_path, capsys):
    foreign = tmp_path / "someone_elses_model"
    foreign.mkdir()
    (foreign / "config.json").write_text("{}")
    assert main(["sample", str(foreign), "--image", "x.png"]) == 1
    err = capsys.readouterr().err
    assert f"no {EXPORT_RECORD}" in err and "another tool or an older framer_ds" in err
    assert main(["sample", str(tmp_path / "absent")]) == 1
    assert "not a directory" in capsys.readouterr().err


def test_final_works_with_the_transformers_pipeline(vit_final):
    """`pipeline("image-classification", model=RUN/final)` and AutoImageProcessor give the same labels and
    scores as the evaluation preprocessing (`framer-ds sample`), with the class names as labels."""
    from transformers import AutoImageProcessor, pipeline

    classifier = pipeline("image-classification", model=str(vit_final), device="cpu")
    processor = AutoImageProcessor.from_pretrained(vit_final)
    model = AutoModelForImageClassification.from_pretrained(vit_final).eval()
    task = VitClassificationTask(load_run_config(vit_final.parent / "config.yaml"))
    config = load_run_config(vit_final.parent / "config.yaml")
    root = VitClassificationTask(config).data_root()
    images = sorted((root / "train").glob("*/*.png"))[::150][:10]
    ours = ImageFolderDataset([(p, 0) for p in images], task.image_transform(model.config, train=False))
    correct = 0
    for index, path in enumerate(images):
        with torch.no_grad():
            expected = model(pixel_values=ours[index]["pixel_values"][None]).logits.softmax(-1)[0]
            from PIL import Image

            via_processor = processor(images=Image.open(path).convert("RGB"), return_tensors="pt")
            processed = model(**via_processor).logits.softmax(-1)[0]
        top = classifier(str(path), top_k=1)[0]
        best = int(expected.argmax())
        assert top["label"] == model.config.id2label[best]
        assert top["score"] == pytest.approx(float(expected[best]), rel=1e-4)
        torch.testing.assert_close(processed, expected, rtol=1e-4, atol=1e-6)
        correct += top["label"] == path.parent.name
    assert correct >= 7, f"{correct} of 10 training images classified correctly"


@pytest.mark.parametrize("text", ['{"task": "vit_cl', "[1, 2]", ""])
def test_a_damaged_record_beside_the_weights_is_named_with_the_fix(tmp_path, capsys, text):
    """Every task's export records (framer_ds_export.json, a video adapter's metadata, the tts layout,
    the drivable_vit record) are read by one function: cut short or not an object, it names the file."""
    from framer_ds.config.errors import ConfigError
    from framer_ds.engine.export import read_export_json

    path = tmp_path / "record.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match="the export is damaged"):
        read_export_json(path)
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / EXPORT_RECORD).write_text(text)
    assert main(["sample", str(tmp_path / "final")]) == 1
    assert "the export is damaged" in capsys.readouterr().err
