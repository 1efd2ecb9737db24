"""The console filters drop exactly the library lines documented in framer_ds/third_party_noise.py:
each by its logger or category AND its message, so a real warning from the same place still shows."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings

import pytest

from framer_ds.third_party_noise import quiet_third_party_noise


@pytest.fixture
def quiet():
    saved = os.environ.get("DS_ACCELERATOR")
    with warnings.catch_warnings():
        quiet_third_party_noise()
        yield
    if saved is None:
        os.environ.pop("DS_ACCELERATOR", None)
    else:
        os.environ["DS_ACCELERATOR"] = saved


def test_the_documented_log_lines_are_dropped_and_their_neighbours_kept(quiet, caplog):
    caplog.set_level(logging.WARNING)
    diffusers = logging.getLogger("diffusers.models.modeling_utils")
    diffusers.warning("There are modules in AutoencoderKL that should be kept in float32: []. Casting ...")
    diffusers.warning("There are modules in X that should be kept in float32: ['encoder']. Casting ...")
    transformers = logging.getLogger("transformers.utils.import_utils")
    transformers.warning("`CLIPImageProcessor` requires torchvision (not installed); falling back to ...")
    transformers.warning("something else entirely")
    kept = [r.getMessage() for r in caplog.records]
    assert kept == [
        "There are modules in X that should be kept in float32: ['encoder']. Casting ...",
        "something else entirely",
    ]


def test_only_the_deprecated_collectives_future_warnings_are_dropped(quiet):
    with warnings.catch_warnings(record=True) as seen:
        for message in (
            "`torch.distributed.all_gather_into_tensor` is deprecated. Use ...",
            "`torch.distributed._all_gather_base` is a private function and will be ...",
            "`torch.distributed.broadcast` is deprecated.",
        ):
            warnings.warn(message, FutureWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["`torch.distributed.broadcast` is deprecated."]


def test_fsdp2s_view_warning_is_dropped_for_vits_patch_embedding_and_the_peft_root_only(quiet):
    with warnings.catch_warnings(record=True) as seen:
        for module in ("FSDPViTPatchEmbeddings", "FSDPPeftModel", "FSDPMyEmbedding"):
            warnings.warn(
                f"FSDP2-wrapped module ({module}) returned a view tensor. An in-place op on this view ...",
                UserWarning,
                stacklevel=1,
            )
    assert [str(w.message).split(" returned")[0] for w in seen] == ["FSDP2-wrapped module (FSDPMyEmbedding)"]


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="with CUDA, DeepSpeed's own detection is kept"
)
def test_deepspeed_is_told_it_runs_on_the_cpu_and_does_not_warn():
    """As a real process: the 'Setting accelerator to CPU ... unable to detect it' warning is gone, and
    a user's own DS_ACCELERATOR wins."""
    code = (
        "from framer_ds.third_party_noise import quiet_third_party_noise; quiet_third_party_noise(); "
        "import os; from deepspeed.accelerator import get_accelerator; "
        "print(os.environ['DS_ACCELERATOR'], get_accelerator()._name)"
    )
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["cpu", "cpu"]
    assert "unable to detect it" not in done.stderr and "WARNING" not in done.stderr, done.stderr


def test_torchaos_import_lines_are_dropped_and_a_real_torchao_warning_kept(quiet, caplog):
    """Once torchao is installed (model.base_precision: int8) every command printed these three kinds of
    lines; other lines of the same loggers still show."""
    caplog.set_level(logging.WARNING)
    torchao = logging.getLogger("torchao")
    torchao.warning(
        "Failed to load /venv/lib/python3.11/site-packages/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so: "
        "Could not load this library: /venv/.../_C_mxfp8.cpython-310-x86_64-linux-gnu.so"
    )
    torchao.warning("Skipping import of cpp extensions due to incompatible torch version.")
    pytree = logging.getLogger("torch.utils._pytree")
    pytree.warning(
        "%s is an Enum subclass and is now natively supported by torch.compile as an opaque value type.",
        "<enum 'KernelPreference'>",
    )
    pytree.warning("something else from pytree")
    diffusers = logging.getLogger("diffusers.quantizers.torchao.torchao_quantizer")
    diffusers.warning("Unable to import `torchao` Tensor objects. This may affect loading checkpoints ...")
    assert [r.getMessage() for r in caplog.records] == [
        "Skipping import of cpp extensions due to incompatible torch version.",
        "something else from pytree",
    ]
