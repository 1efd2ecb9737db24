"""Weight decay reaches matrices only: RMSNorm weights and biases are exempt (as transformers' Trainer
does), also after a resume applies the running config's weight_decay."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from framer_ds.config.train_config import TrainConfig
from framer_ds.engine.resume.running_config import apply_running_config
from framer_ds.train.lr_schedule import build_lr_scheduler
from framer_ds.train.run import build_optimizer

LR, DECAY = 0.1, 0.5


def tiny_llama_with_biases() -> torch.nn.Module:
    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, attention_bias=True,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def step_with_zero_gradients(model, optimizer) -> dict[str, torch.Tensor]:
    """With zero gradients Adam's update is 0/(0+eps) = 0: only decoupled decay moves a weight, by the
    exact factor (1 - lr * weight_decay) (fp32: 0.95 is applied in one multiply, compared exactly)."""
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    return before


def check_decay(model, before) -> None:
    for name, param in model.named_parameters():
        if param.ndim >= 2:
            torch.testing.assert_close(param, before[name] * (1 - LR * DECAY), rtol=0, atol=0, msg=name)
        else:
            assert "norm" in name or name.endswith("bias"), name
            assert torch.equal(param, before[name]), f"{name} was decayed"


def test_norm_weights_and_biases_are_not_decayed():
    model = tiny_llama_with_biases()
    train = TrainConfig.model_validate({"optimizer": {"learning_rate": LR, "weight_decay": DECAY}})
    optimizer = build_optimizer(model, train, torch.device("cpu"))
    check_decay(model, step_with_zero_gradients(model, optimizer))


def test_a_resume_keeps_the_exempt_group_exempt():
    model = tiny_llama_with_biases()
    first = TrainConfig.model_validate({"optimizer": {"learning_rate": LR, "weight_decay": 0.1}})
    optimizer = build_optimizer(model, first, torch.device("cpu"))
    scheduler = build_lr_scheduler("constant", optimizer, 0, 10)
    running = TrainConfig.model_validate({"optimizer": {"learning_rate": LR, "weight_decay": DECAY}})
    apply_running_config(optimizer, scheduler, running)
    check_decay(model, step_with_zero_gradients(model, optimizer))
