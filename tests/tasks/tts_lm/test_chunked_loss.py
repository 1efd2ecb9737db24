"""The chunked loss is the plain full-logits cross-entropy, value and gradients, without the [B, T, V]
logits: through a padded and a packed batch, a head with post-processing (Granite's logits_scaling), and
an unknown post-processing refused rather than trained on."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from framer_ds.tasks.tts_lm import chunked_loss
from framer_ds.tasks.tts_lm.chunked_loss import ChunkedHeadLoss

VOCAB = 1000


def tiny(model_type: str = "llama", **extra):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        model_type, vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, **extra,
    )  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").float()


def plain_losses(model, inputs, labels):
    logits = model(**inputs, use_cache=False).logits[:, :-1]
    return F.cross_entropy(
        logits.float().reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100, reduction="none"
    ).view(labels[:, 1:].shape)


def batch(packed: bool):
    from framer_ds.tasks.tts_lm.token_batches import collate_packed, collate_padded
    from framer_ds.tasks.tts_lm.token_sequences import PackedBlock, TokenSequence

    g = torch.Generator().manual_seed(1)
    seqs = [
        TokenSequence(ids := torch.randint(0, VOCAB, (n,), generator=g).tolist(), list(ids)) for n in (37, 23)
    ]
    seqs[1].labels[:5] = [-100] * 5  # an ignored prompt
    if not packed:
        return collate_padded(seqs, 0)
    block = PackedBlock()
    for s in seqs:
        block.add(s)
    return collate_packed([block, block], 64, 0)


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """64-token chunks (the floor) over 2 x 63 next-token positions: two chunks, the last one partial."""
    monkeypatch.setattr(chunked_loss, "CHUNK_LOGIT_BYTES", 1)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("model_type", ["llama", "granite"])
def test_chunked_loss_and_gradients_equal_the_full_logits_loss(packed, model_type):
    extra = {"logits_scaling": 4.0} if model_type == "granite" else {}
    model = tiny(model_type, **extra)
    data = batch(packed)
    labels = data.pop("labels")
    assert chunked_loss.chunk_tokens(VOCAB) < labels[:, 1:].numel() < 2 * chunked_loss.chunk_tokens(VOCAB)

    expected = plain_losses(model, data, labels)
    expected.sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    got, _ = ChunkedHeadLoss()(model, data, labels)
    got.sum().backward()

    # fp32 throughout: the same matmuls on the same rows, only split differently -> rounding-level (a
    # few ulp of values ~log(1000) ~ 7); the gradients sum the same terms in another order.
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, want[name], rtol=1e-4, atol=1e-6, msg=name)


def test_eval_predictions_are_the_argmax_of_the_full_logits():
    model = tiny()
    data = batch(False)
    labels = data.pop("labels")
    with torch.no_grad():
        full = model(**data).logits[:, :-1]
        losses, predictions = ChunkedHeadLoss()(model, data, labels, top1=True)
    torch.testing.assert_close(losses, plain_losses(model, data, labels))
    assert torch.equal(predictions, full.argmax(-1))


def test_an_unknown_logit_post_processing_is_refused(monkeypatch):
    model = tiny()
    monkeypatch.setattr(chunked_loss, "logit_transform", lambda config: lambda logits: logits * 3)
    data = batch(False)
    with pytest.raises(RuntimeError, match="post-processes its head's logits"):
        ChunkedHeadLoss()(model, data, data.pop("labels"))


def test_the_planner_measures_the_chunked_loss(tmp_path, tiny_tts):
    """`framer-ds plan` runs training_loss on fake tensors under torch's MemTracker: the chunk loop must
    run there (a head called again from plain code read as a second iteration and was refused), and the
    per-sample activations must be those of the chunked loss, below ONE fp32 copy of the [T, V] logits
    (the full-logits loss kept ~3 of them)."""
    from test_tts_lm import load_task, write_config

    from framer_ds.lab.activations import probe_activations

    tokens = 1024
    fresh = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
             "num_attention_heads": 2, "num_key_value_heads": 1}  # fmt: skip
    model = {"source": {"config": fresh}, "tokenizer": str(tiny_tts / "model")}
    config = write_config(
        tmp_path / "c.yaml", tmp_path / "run", model=model, source={"builtin": "tiny_speech"},
        max_seq_length=tokens,
    )  # fmt: skip
    task = load_task(config, "train.mixed_precision=no")
    vocab = len(task.assets.tokenizer)
    probe = probe_activations(task, with_eval=False)
    logits_fp32 = tokens * vocab * 4
    assert 0 < probe.per_sample < logits_fp32
