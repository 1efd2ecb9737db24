"""A key set twice in one YAML mapping is refused with both lines (PyYAML keeps the second silently)."""

from __future__ import annotations

from pathlib import Path

import pytest

from framer_ds.config.errors import ConfigError
from framer_ds.config.launch_files import load_yaml_file
from framer_ds.config.loader import parse_yaml
from framer_ds.config.yaml_keys import RepeatedKeysError
from framer_ds.tasks.run_config import load_run_config

REPO = Path(__file__).resolve().parents[2]

# Line numbers matter: the repeats are on lines 4/6 (`train.length.steps` inside the first block), 2/8
# (`train`) and 10/11 (`data.hflip`), reported in the order of the repeat.
TWICE = """task: vit_classification
train:
  length:
    steps: 40
    epochs: null
    steps: 4
  seed: 3
train:
  seed: 5
data: {hflip: true,
       hflip: false}
"""


def test_every_repeated_key_is_named_with_both_lines(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text(TWICE)
    with pytest.raises(ConfigError) as info:
        load_run_config(path)
    problems = [str(p) for p in info.value.problems]
    assert len(problems) == 3, problems  # all at once, and nothing from validating a half-read config
    assert problems[0].startswith(f"{path}: train.length.steps: set twice, on lines 4 and 6")
    assert problems[1].startswith(f"{path}: train: set twice, on lines 2 and 8")
    assert problems[2].startswith(f"{path}: data.hflip: set twice, on lines 10 and 11")
    assert "merge them into one" in problems[1]


def test_a_merge_key_and_its_override_are_not_a_repeat():
    """`<<: *base` then `lr: ...` overrides the merged value on purpose."""
    text = "base: &base {lr: 1, wd: 2}\nrun:\n  <<: *base\n  lr: 3\nother:\n  <<: *base\n"
    merged = parse_yaml(text)
    assert merged["run"] == {"lr": 3, "wd": 2} and merged["other"] == {"lr": 1, "wd": 2}


def test_the_same_key_in_different_mappings_is_fine():
    assert parse_yaml("a: {x: 1}\nb: {x: 2}\nc: [{x: 1}, {x: 2}]\n")["c"] == [{"x": 1}, {"x": 2}]


def test_a_repeat_in_a_list_item_is_named_by_its_index():
    with pytest.raises(RepeatedKeysError) as info:
        parse_yaml("hosts:\n  - {name: a, slots: 1}\n  - name: b\n    name: c\n")
    assert [(r.key, r.first_line, r.line) for r in info.value.repeats] == [("hosts[1].name", 3, 4)]


def test_an_accelerate_yaml_with_a_repeated_key_is_a_problem_not_a_silent_last_value(tmp_path):
    shipped = (REPO / "configs" / "accelerate_cpu_2proc.yaml").read_text()
    path = tmp_path / "accelerate.yaml"
    path.write_text(shipped.rstrip("\n") + "\nnum_processes: 8\n")
    data, problems = load_yaml_file(path)
    assert data is None and len(problems) == 1
    assert str(problems[0]).startswith(f"{path}: num_processes: set twice, on lines ")
    clean, none = load_yaml_file(REPO / "configs" / "accelerate_cpu_2proc.yaml")
    assert clean is not None and clean["num_processes"] == 2 and none == []
