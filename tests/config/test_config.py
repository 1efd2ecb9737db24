"""Config loading: overrides, every error case with its message, all errors at once."""

from __future__ import annotations

import math
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from framer_ds.config.errors import ConfigError
from framer_ds.config.loader import apply_overrides, dump_run_config
from framer_ds.tasks.run_config import load_run_config

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "configs" / "quickstart.yaml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def problems_of(path: Path, overrides: list[str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_run_config(path, overrides or [])
    return [str(p) for p in info.value.problems]


def test_quickstart_loads_with_overrides():
    config = load_run_config(
        QUICKSTART, ["train.length.steps=20", "train.optimizer.learning_rate=1e-4", "log.tensorboard=true"]
    )
    assert config.train.length.steps == 20
    assert config.train.optimizer.learning_rate == pytest.approx(1e-4)
    assert config.log.tensorboard is True
    assert config.task == "vit_classification"


def test_override_values_are_parsed_as_yaml():
    raw: dict = {"train": {"resume": "latest"}}
    assert apply_overrides(raw, ["train.resume=null", "log.wandb.offline=true", "a.b.c=[1, 2]"]) == []
    assert raw == {"train": {"resume": None}, "log": {"wandb": {"offline": True}}, "a": {"b": {"c": [1, 2]}}}


def test_malformed_override_is_reported():
    assert "key.path=value" in problems_of(QUICKSTART, ["train.length.steps"])[0]


def test_problems_from_overrides_name_the_override():
    """A bad value typed on the command line is looked for there: the error says which override."""
    with pytest.raises(ConfigError) as info:
        load_run_config(
            QUICKSTART, ["train.optimizer.learning_rate=abc", "train.lrr=1", "train.length.epochs=0"]
        )
    lines = sorted(info.value.render().splitlines()[1:])
    assert lines[0].startswith("  - train.length.epochs: got 0") and lines[0].endswith(
        "(in override train.length.epochs=0)"
    )
    assert lines[1].startswith("  - train.lrr: unknown key") and lines[1].endswith(
        "(in override train.lrr=1)"
    )
    assert lines[2].startswith("  - train.optimizer.learning_rate: got 'abc'")
    assert lines[2].endswith("(in override train.optimizer.learning_rate=abc)")
    with pytest.raises(ConfigError) as from_file:
        load_run_config(QUICKSTART, ["train.length.steps=3", "train.optimizer.learning_rate=abc"])
    assert "train.length.steps" not in from_file.value.render()  # a valid override is not blamed


def test_override_into_a_value_is_reported():
    found = problems_of(QUICKSTART, ["output_dir.x=1"])
    assert any("'output_dir' is a value, not a section" in p for p in found)


def test_misspelled_key_suggests_the_right_one():
    found = problems_of(QUICKSTART, ["train.gradient_acumulation_steps=4"])
    assert len(found) == 1
    assert found[0].startswith("train.gradient_acumulation_steps: unknown key.")
    assert "Did you mean 'gradient_accumulation_steps'?" in found[0]


def test_all_errors_reported_at_once():
    found = problems_of(
        QUICKSTART,
        ["train.micro_batch_siz=3", "train.mixed_precision=bf61", "train.micro_batch_size=zero", "taks=x"],
    )
    joined = "\n".join(found)
    assert len(found) == 4, joined
    assert "train.micro_batch_siz: unknown key. Did you mean 'micro_batch_size'" in joined
    assert "train.mixed_precision: got 'bf61'" in joined and "'no', 'bf16' or 'fp16'" in joined
    assert "train.micro_batch_size: got 'zero'" in joined
    assert "taks: unknown key. Did you mean 'task'?" in joined


def test_wrong_type_names_key_path(tmp_path):
    found = problems_of(QUICKSTART, ["train.length.epochs=-1"])
    assert found == [
        "train.length.epochs: got -1: Input should be greater than 0. (in override train.length.epochs=-1)"
    ]


def test_unknown_task_suggests_registered(tmp_path):
    found = problems_of(write(tmp_path, "task: vit_clasification\noutput_dir: x\n"))
    assert "unknown task 'vit_clasification'. Did you mean 'vit_classification'?" in found[0]


def test_missing_task_and_output_dir(tmp_path):
    found = problems_of(write(tmp_path, "train: {length: {epochs: 2}}\n"))
    joined = "\n".join(found)
    assert "task: required key is missing" in joined
    assert "output_dir: required key is missing" in joined


def test_task_sections_are_strict(tmp_path):
    found = problems_of(QUICKSTART, ["data.hflp=true", "model.sourc=/y"])
    joined = "\n".join(found)
    assert "data.hflp: unknown key. Did you mean 'hflip'?" in joined
    assert "model.sourc: unknown key. Did you mean 'source'?" in joined


def test_invalid_yaml_and_missing_file(tmp_path):
    assert "invalid YAML" in problems_of(write(tmp_path, "task: [unclosed\n"))[0]
    assert "file not found" in problems_of(tmp_path / "nope.yaml")[0]
    assert "top level must be a mapping" in problems_of(write(tmp_path, "- a\n- b\n"))[0]


def test_resume_and_overwrite_conflict(tmp_path):
    """Wherever they are written they contradict each other, and neither replaces the other: `--overwrite`
    deletes the run a resume would continue, so a requeued job's config that resumes is never wiped by it."""
    resuming = QUICKSTART.read_text().replace("\ntrain:\n", "\ntrain:\n  resume: latest\n", 1)
    assert "contradictory" in problems_of(write(tmp_path, resuming + "overwrite_output_dir: true\n"))[0]
    assert "contradictory" in problems_of(write(tmp_path, resuming), ["overwrite_output_dir=true"])[0]
    assert "contradictory" in problems_of(QUICKSTART, ["train.resume=latest", "overwrite_output_dir=true"])[0]


def test_resolved_config_round_trips(tmp_path):
    config = load_run_config(QUICKSTART, ["train.length.steps=7"])
    path = tmp_path / "resolved.yaml"
    path.write_text(dump_run_config(config))
    again = load_run_config(path)
    assert again == config
    assert yaml.safe_load(path.read_text())["train"]["length"] == {"steps": 7}


def test_mixed_precision_no_survives_yaml_reading_it_as_false(tmp_path):
    assert load_run_config(QUICKSTART, ["train.mixed_precision=no"]).train.mixed_precision == "no"
    text = QUICKSTART.read_text()
    assert '  mixed_precision: "no"\n' in text  # quoted there; unquoted YAML 1.1 reads `no` as false
    unquoted = text.replace('  mixed_precision: "no"\n', "  mixed_precision: no\n")
    config = load_run_config(write(tmp_path, unquoted))
    assert config.train.mixed_precision == "no"
    assert any("mixed_precision" in p for p in problems_of(QUICKSTART, ["train.mixed_precision=yes"]))


def _float_fields(model: type[BaseModel], seen: set[type] | None = None) -> Iterator[tuple[type, str, Any]]:
    """(section, field, a non-finite value shaped like the field) for every float field under `model`."""
    seen = set() if seen is None else seen
    if model in seen:
        return
    seen.add(model)
    for name, field in model.model_fields.items():
        shapes = [field.annotation]
        while shapes:
            annotation = shapes.pop()
            args = typing.get_args(annotation)
            if annotation is float:
                yield model, name, math.inf
            elif typing.get_origin(annotation) in (list, tuple) and float in args:
                yield model, name, [math.nan] * (len(args) if typing.get_origin(annotation) is tuple else 1)
            elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
                yield from _float_fields(annotation, seen)
            else:
                shapes.extend(args)  # X | None, Annotated[...]


def test_no_float_field_of_any_task_accepts_nan_or_inf():
    """`train.optimizer.epsilon=1e400` (inf) used to pass `gt=0`, train nothing and exit 0: every float field
    of every registered task's config refuses NaN and inf (one rule on StrictModel)."""
    import framer_test_tasks  # noqa: F401  (the test tasks register too)
    from framer_ds.tasks.registry import available_tasks, get_task_class

    checked = set()
    for task in available_tasks():
        for section, name, value in _float_fields(get_task_class(task).config_class()):
            with pytest.raises(ValidationError) as info:
                section.model_validate({name: value})
            refused = [e for e in info.value.errors() if e["loc"][0] == name]
            assert refused and refused[0]["type"] == "finite_number", (section.__name__, name, refused)
            checked.add(f"{section.__name__}.{name}")
    assert {
        "OptimizerConfig.epsilon",
        "Cadence.fraction",
        "EdmOptions.p_std",
        "TextMixOptions.ratio_end",
    } <= checked


def test_an_overflowing_float_is_named_with_the_fix():
    found = problems_of(QUICKSTART, ["train.optimizer.epsilon=1e400", "train.optimizer.learning_rate=.nan"])
    assert len(found) == 2
    assert all("must be a finite number" in p for p in found)
    assert {p.split(":")[0] for p in found} == {"train.optimizer.epsilon", "train.optimizer.learning_rate"}
