"""The first DeepSpeed run says it is compiling an op instead of sitting silent for a minute, and
later runs (the op cached) say nothing."""

from __future__ import annotations

import pytest

from framer_ds.engine.deepspeed_ops import announce_op_builds, op_library


@pytest.fixture
def fake_builder(monkeypatch, tmp_path):
    """A DeepSpeed op builder whose build only writes the library where torch's loader caches it."""
    from deepspeed.ops.op_builder.builder import OpBuilder

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))

    def build(self, verbose=True):
        library = op_library(self.name)
        library.parent.mkdir(parents=True, exist_ok=True)
        library.write_bytes(b"")
        return "module"

    monkeypatch.setattr(OpBuilder, "jit_load", build)
    announce_op_builds()
    announce_op_builds()  # idempotent: one announcement per build, not one per call

    class FakeOp(OpBuilder):
        def absolute_name(self):
            return self.name

        def sources(self):
            return []

    return FakeOp(name="framer_ds_test_op")


def test_a_build_is_announced_once_and_a_cached_op_is_not(fake_builder, capsys, tmp_path):
    assert fake_builder.jit_load() == "module"
    err = capsys.readouterr().err
    assert err.count("building DeepSpeed's framer_ds_test_op op once") == 1
    assert str(tmp_path) in err  # names the cache
    assert fake_builder.jit_load() == "module"
    assert capsys.readouterr().err == ""
