"""ZeRO-3 saves with parameters still in flight from DeepSpeed's prefetch.

Found on an H200 (2026-11-26, docs/benchmarks.md "GPU suite"): every ZeRO-3 LoRA run at the real SVD
size died at its final export with DeepSpeed's "Cannot partition a param in flight". ZeRO-3 gathers the
next modules' parameters ahead of use, asynchronously; only a backward settles them, so after an eval
or sampling forward a gather for the save meets a parameter in flight. On a CPU the gathers finish
before anyone looks, so the test puts one parameter in flight exactly as the prefetcher does (an async
all-gather registered with the coordinator) and then saves through framer_ds's export functions.
"""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest

from conftest import REPO, accelerate_launch_cmd, launch_env

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import torch
    from accelerate import Accelerator, InitProcessGroupKwargs
    from safetensors.torch import load_file

    from framer_ds.engine.export import gathered_trainable_state_dict, save_module_gathered

    # gloo as framer_ds's build_accelerator asks for it on a CPU (else every rank says it is rank 0)
    accelerator = Accelerator(mixed_precision="no", kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    for index, layer in enumerate(model):
        layer.requires_grad_(index % 2 == 0)  # a frozen base with trained layers, as a LoRA
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    x = torch.randn(4, 64)
    for _ in range(2):
        accelerator.backward(model(x).square().mean())
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    with torch.no_grad():
        model(x)  # an eval forward: no backward settles what it prefetched

    def put_in_flight(param):
        # What the prefetcher does (partitioned_param_coordinator.__all_gather_params_): an async
        # all-gather whose handle waits in the coordinator's registry until the module runs.
        model.empty_partition_cache()
        coordinator = model.optimizer.parameter_offload.get_param_coordinator()
        registry = coordinator._PartitionedParameterCoordinator__inflight_param_registry
        registry[param] = param.all_gather_coalesced([param])
        assert param.ds_status.name == "INFLIGHT"

    put_in_flight(model.module[2].weight)
    state = gathered_trainable_state_dict(accelerator, model)
    put_in_flight(model.module[1].weight)
    out = Path(sys.argv[1])
    save_module_gathered(accelerator, model, out / "model.safetensors")
    if accelerator.is_main_process:
        saved = load_file(out / "model.safetensors")
        shapes = {
            "trainable": {k: list(v.shape) for k, v in state.items()},
            "saved": {k: list(v.shape) for k, v in saved.items()},
        }
        (out / "shapes.json").write_text(json.dumps(shapes))
    """
)


def test_saves_under_zero3_wait_for_prefetched_parameters(tmp_path):
    script = tmp_path / "save_in_flight.py"
    script.write_text("import json\n" + SCRIPT)
    deepspeed_json = tmp_path / "zero3.json"
    deepspeed_json.write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": 4,
                "gradient_accumulation_steps": 1,
                "zero_optimization": {
                    "stage": 3,
                    "stage3_param_persistence_threshold": 0,  # partition even these tiny layers
                    "stage3_prefetch_bucket_size": 100_000,
                    "stage3_gather_16bit_weights_on_model_save": True,
                },
            }
        )
    )
    cmd = accelerate_launch_cmd(
        "--config_file",
        "configs/accelerate_cpu_2proc.yaml",
        "--deepspeed_config_file",
        str(deepspeed_json),
        str(script),
        str(tmp_path),
    )
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=280)
    assert "Cannot partition a param in flight" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
    shapes = json.loads((tmp_path / "shapes.json").read_text())
    layers = (("weight", [64, 64]), ("bias", [64]))
    assert shapes["trainable"] == {f"{i}.{name}": shape for i in (0, 2) for name, shape in layers}
    assert len(shapes["saved"]) == 8 and all(shape for shape in shapes["saved"].values())
