"""Next-token cross-entropy from the final hidden states, a chunk of tokens at a time, so the [B, T, V]
logits (and their fp32 copy) never exist at once.

Why: at the Orpheus vocabulary (156,939) one 8192-token sequence has 4.9 GB of fp32 logits, and a plain
`F.cross_entropy(logits.float(), ...)` step keeps ~3x that alive (logits, their fp32 copy, the softmax
saved for backward). Here the model is asked for the logits of its last position only (`logits_to_keep`,
which every transformers causal LM takes) and its final hidden states; each chunk of tokens goes through
the model's own output head (so ZeRO-3 gathers it and DDP / peft see it as usual) under activation
checkpointing: its backward recomputes the chunk's logits instead of keeping them, so the peak is one
chunk's logits plus the hidden states. liger-kernel's fused linear cross-entropy does the same in Triton
(PyPI has 0.8.5), but it is GPU-only, not in this project's stack and could not be tested here; this
torch version runs on CPU and GPU alike and gives the per-token losses the text/audio parts need.

Heads that post-process their logits (Granite's `logits_scaling`, Gemma's soft-capping) are applied from
the model config, and the first real call checks the head path against the logits the model itself
computed for the last position, so an unknown post-processing fails loudly instead of training a wrong
loss.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100
CHUNK_LOGIT_BYTES = 256 * 2**20  # fp32 logits of one chunk; its backward holds ~3x this


def chunk_tokens(vocab_size: int) -> int:
    """Tokens per chunk: CHUNK_LOGIT_BYTES of fp32 logits (427 at 156,939 ids), at least 64."""
    return max(64, CHUNK_LOGIT_BYTES // (4 * vocab_size))


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside DDP / DeepSpeed (`.module`) and torch.compile (`._orig_mod`) wrappers."""
    while True:
        inner = getattr(model, "module", None)
        inner = inner if isinstance(inner, torch.nn.Module) else getattr(model, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner


def logit_transform(config) -> Callable[[torch.Tensor], torch.Tensor]:
    """What the model's forward does to `lm_head`'s output before returning logits."""
    scaling = getattr(config, "logits_scaling", None)  # Granite divides
    cap = getattr(config, "final_logit_softcapping", None)  # Gemma 2/3

    def apply(logits: torch.Tensor) -> torch.Tensor:
        if scaling not in (None, 1, 1.0):
            logits = logits / scaling
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    return apply


def _is_fake(tensor: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return tensor.device.type == "meta" or is_fake(tensor)


class ChunkedHeadLoss:
    """Per-token losses (and, without grad, the argmax) of a causal LM, logits made one chunk at a time."""

    def __init__(self) -> None:
        self.checked = False
        self._chunks: HeadChunks | None = None

    def __call__(
        self,
        model: torch.nn.Module,
        inputs: dict[str, torch.Tensor],
        labels: torch.Tensor,
        top1: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(losses [B, T-1] fp32, predictions [B, T-1] or None) for next-token `labels[:, 1:]`."""
        out = model(**inputs, use_cache=False, output_hidden_states=True, logits_to_keep=1)
        hidden = out.hidden_states[-1]
        inner = unwrap(model)
        head = inner.get_output_embeddings()
        transform = logit_transform(inner.config)
        if not self.checked and not _is_fake(hidden):
            self._check_head(type(inner).__name__, head, transform, hidden, out.logits)
        targets = labels[:, 1:]
        chunks = HeadChunks(head, transform, chunk_tokens(out.logits.shape[-1]))  # width also under ZeRO-3
        self._chunks = chunks  # alive until backward: the planner's tracker holds it by a weak reference
        return chunks(hidden[:, :-1], targets, top1)

    def _check_head(self, name: str, head, transform, hidden: torch.Tensor, logits: torch.Tensor) -> None:
        with torch.no_grad():
            ours = transform(head(hidden[:, -1:])).float()
        theirs = logits[:, -1:].detach().float()
        scale = theirs.abs().amax().clamp_min(1.0)
        # bf16 logits carry ~3 significant digits; 2e-2 of their scale separates rounding from a different
        # post-processing (a missed 1/logits_scaling is off by a factor of several).
        if not torch.allclose(ours, theirs, rtol=0, atol=float(2e-2 * scale)):
            raise RuntimeError(
                f"{name}: the model post-processes its head's logits in a way the "
                "chunked loss does not know (framer_ds/tasks/tts_lm/chunked_loss.py logit_transform); "
                "add it there"
            )
        self.checked = True


class HeadChunks(torch.nn.Module):
    """The chunk loop as one module call around the head's.

    Why a module: the planner's activation probe (torch's MemTracker) accepts a module called several times
    in one step only from inside another module's forward; called from plain code, the second call reads
    as a second training iteration and is refused."""

    def __init__(self, head: torch.nn.Module, transform: Callable, step: int):
        super().__init__()
        self.head, self.transform, self.step = head, transform, step

    def forward(
        self, states: torch.Tensor, targets: torch.Tensor, top1: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        flat_h, flat_y = states.reshape(-1, states.shape[-1]), targets.reshape(-1)
        losses, predictions = [], []
        for start in range(0, flat_y.shape[0], self.step):
            h, y = flat_h[start : start + self.step], flat_y[start : start + self.step]
            if torch.is_grad_enabled() and not top1:  # backward recomputes this chunk's logits
                losses.append(checkpoint(_chunk_loss, self.head, self.transform, h, y, use_reentrant=False))
                continue
            logits = self.transform(self.head(h)).float()
            losses.append(F.cross_entropy(logits, y, ignore_index=IGNORE_INDEX, reduction="none"))
            if top1:
                predictions.append(logits.argmax(-1))
        loss = torch.cat(losses).view(targets.shape)
        return loss, torch.cat(predictions).view(targets.shape) if predictions else None


def _chunk_loss(head, transform, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = transform(head(hidden)).float()
    return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="none")
