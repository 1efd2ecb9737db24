"""accelerate's ./.deepspeed_env (framer_ds/launch/environment.py): the run it launched removes it, naming
the tokens it carried; nothing else does; a leftover that breaks `deepspeed --hostfile` is named. The
launches themselves run on the real cluster (tests/launch/test_cluster.py)."""

from __future__ import annotations

import pytest

from framer_ds.config.errors import ConfigError
from framer_ds.launch.environment import remove_accelerate_deepspeed_env, use_deepspeed_json

ACCELERATE_WROTE = "ACCELERATE_USE_DEEPSPEED=true\nWANDB_API_KEY=abc\nPATH=/usr/bin\n"


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_run_accelerate_launched_through_it_removes_it(checkout, monkeypatch):
    (checkout / ".deepspeed_env").write_text(ACCELERATE_WROTE)
    monkeypatch.setenv("CROSS_RANK", "0")  # DeepSpeed's launcher
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    note = remove_accelerate_deepspeed_env()
    assert not (checkout / ".deepspeed_env").exists()
    assert note.startswith("removed ./.deepspeed_env") and "it carried WANDB_API_KEY" in note
    assert "abc" not in note


@pytest.mark.parametrize(
    "content,env",
    [
        (ACCELERATE_WROTE, {"ACCELERATE_USE_DEEPSPEED": "true"}),  # a run not started by DeepSpeed's runner
        ("NCCL_DEBUG=INFO\n", {"CROSS_RANK": "0", "ACCELERATE_USE_DEEPSPEED": "true"}),  # the user's own file
    ],
    ids=["another_run", "users_file"],
)
def test_anything_else_leaves_it(checkout, monkeypatch, content, env):
    (checkout / ".deepspeed_env").write_text(content)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert remove_accelerate_deepspeed_env() is None
    assert (checkout / ".deepspeed_env").read_text() == content


def test_a_leftover_that_reached_deepspeed_hostfile_is_named(checkout, monkeypatch):
    (checkout / ".deepspeed_env").write_text(ACCELERATE_WROTE)
    (checkout / "z.json").write_text("{}")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(ConfigError) as error:
        use_deepspeed_json(checkout / "z.json")
    assert "./.deepspeed_env, left here by an earlier `accelerate launch`" in error.value.render()
    assert "rm .deepspeed_env" in error.value.render()
