"""The activation probe's instrument: the peak of activations plus backward temporaries over one step.

Why not torch's `MemTracker` (torch.distributed._tools.mem_tracker), which the probe used before: it keeps
per-module snapshots (a deep copy of every device's counters at every module's entry and exit, a walk over
every tracked module after every operation) and splits what it counts into seven kinds, and the probe
reads one number. On the SVD UNet those books were ~40% of a probe step (16.0 s of CPU against 9.2 s for
the same fake step with no tracker). This tracker keeps only that number, and counts exactly what
`MemTracker` counted towards it (tests/lab/test_activation_tracker.py compares the two on real models):

- every storage an operation returns that was not seen before counts, from that operation until the
  storage dies (a weak reference's callback, on whatever thread frees it), at its size (a `resize_` is
  followed);
- parameters, buffers and the gradients of trained parameters do not count: a module's parameters and
  buffers (and those of its submodules) are set apart when it is first called, and a gradient when
  autograd hands it over (a hook on each trained parameter), so a gradient counts only from the operation
  that makes it to that hook, as before;
- `MemTracker`'s module bookkeeping registers a multi-gradient hook ("all") on the inputs of every module
  called in forward; autograd then holds each input's gradient until the module's last one is computed.
  That changes the peak, so this tracker registers the same hook (doing nothing), and its figures stay
  the ones the planner's tests and the shipped configs' headers were measured with.

The collector stays off for the step: a storage dies when its last reference
goes, and one held by a reference cycle lives to the end of the step. With the collector on, when it ran
depended on every Python object the process had made before, so the same config planned to different
figures in different processes (LTX-2's header: 47.52, 47.54 and 47.60 GiB). Held to the end is also what
a GPU sees when the collector does not happen to run inside the step.

The peak is read after every change, per device, as `MemTracker`'s snapshot updates were, and a CUDA
storage counts in whole blocks of the caching allocator's smallest allocation, as it counted them.
"""

from __future__ import annotations

import gc
import weakref
from functools import partial, wraps
from typing import Any

import torch
from torch.autograd.graph import register_multi_grad_hook
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary


def _storages(tensor: torch.Tensor) -> list[torch.UntypedStorage]:
    """The storages behind `tensor` (a wrapper subclass's inner tensors')."""
    if not is_traceable_wrapper_subclass(tensor):
        return [tensor.untyped_storage()]
    inner, _ = tensor.__tensor_flatten__()  # type: ignore[attr-defined]
    found = []
    for name in inner:
        value = getattr(tensor, name)
        if isinstance(value, torch.Tensor):
            found += _storages(value)
    return found


CUDA_BLOCK = 512
"""The CUDA caching allocator's smallest allocation (MemTracker's _PYTORCH_MIN_ALLOCATE)."""


def _noop(*_: Any) -> None:
    return None


class _Entry:
    """One storage's bytes on its device and whether they count (an activation or temporary) or not (a
    parameter, buffer or gradient)."""

    __slots__ = ("bytes", "counted", "device")

    def __init__(self, size: int, counted: bool, device: torch.device):
        self.bytes = size
        self.counted = counted
        self.device = device

    def size_of(self, storage: torch.UntypedStorage) -> int:
        size = storage.nbytes()
        return -(-size // CUDA_BLOCK) * CUDA_BLOCK if self.device.type == "cuda" else size


class ActivationTracker(TorchDispatchMode):
    """`with FakeTensorMode(...), ActivationTracker() as tracker: <step>`, then `tracker.activation_peak`
    (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.activation_peak = 0
        self._live: dict[torch.device, int] = {}
        self._entries = WeakIdKeyDictionary()  # storage -> (_Entry, weak reference with its callback)
        self._modules_seen: weakref.WeakSet = weakref.WeakSet()
        self._hooked = WeakIdKeyDictionary()  # trained parameter -> its two hook handles
        self._handles: list[Any] = []
        self._resize = torch.UntypedStorage.resize_
        self._collector_was_on = False

    # --- counting -----------------------------------------------------------------------------------

    def _change(self, device: torch.device, delta: int) -> None:
        now = self._live[device] = self._live.get(device, 0) + delta
        if now > self.activation_peak:
            self.activation_peak = now

    def _died(self, entry: _Entry, _: weakref.ref) -> None:
        if entry.counted and entry.bytes:
            self._change(entry.device, -entry.bytes)

    def _new(self, storage: torch.UntypedStorage, device: torch.device, counted: bool) -> None:
        entry = _Entry(0, counted, device)
        entry.bytes = entry.size_of(storage)
        self._entries[storage] = (entry, weakref.ref(storage, partial(self._died, entry)))
        if counted and entry.bytes:
            self._change(device, entry.bytes)

    def _track_output(self, tensor: torch.Tensor) -> None:
        """A storage an operation returned: new ones count; a known one follows its size."""
        for storage in _storages(tensor):
            known = self._entries.get(storage)
            if known is None:
                self._new(storage, tensor.device, counted=True)
                continue
            self._follow_size(known[0], storage)
            return  # as MemTracker._track: one known storage ends the look

    def _follow_size(self, entry: _Entry, storage: torch.UntypedStorage) -> None:
        size = entry.size_of(storage)
        if size != entry.bytes:
            delta, entry.bytes = size - entry.bytes, size
            if entry.counted:
                self._change(entry.device, delta)

    def _set_apart(self, tensor: torch.Tensor) -> None:
        """A parameter's, buffer's or gradient's storages stop counting (or never start)."""
        for storage in _storages(tensor):
            known = self._entries.get(storage)
            if known is None:
                self._new(storage, tensor.device, counted=False)
            elif known[0].counted:
                known[0].counted = False
                self._change(known[0].device, -known[0].bytes)

    # --- modules and gradients ------------------------------------------------------------------------

    def _first_call(self, module: torch.nn.Module) -> None:
        """Set apart the parameters, gradients and buffers of `module` and every submodule not seen
        yet, and hook the trained parameters' gradients."""
        stack = [module]
        while stack:
            current = stack.pop()
            if current in self._modules_seen:
                continue
            self._modules_seen.add(current)
            for param in current._parameters.values():
                if param is None:
                    continue
                self._set_apart(param)
                if param.grad is not None:
                    self._set_apart(param.grad)
                if param.requires_grad and param not in self._hooked:
                    self._hooked[param] = (
                        param.register_hook(self._set_apart),
                        param.register_post_accumulate_grad_hook(lambda p: self._set_apart(p.grad)),
                    )
            for buffer in current._buffers.values():
                if buffer is not None:
                    self._set_apart(buffer)
            stack.extend(m for m in current._modules.values() if m is not None)

    def _pre_forward(self, module: torch.nn.Module, args: Any) -> None:
        if module not in self._modules_seen:
            self._first_call(module)
        if torch._C._current_graph_task_id() != -1:
            return  # a recomputation in backward (activation checkpointing)
        flat, _ = tree_flatten(args)
        needing = [a for a in flat if isinstance(a, torch.Tensor) and a.requires_grad]
        if needing:
            register_multi_grad_hook(needing, _noop)  # see the module docstring: it holds gradients

    # --- the mode -------------------------------------------------------------------------------------

    def __enter__(self) -> ActivationTracker:
        self._collector_was_on = gc.isenabled()
        gc.disable()  # see the module docstring: a figure that does not depend on when it runs
        self._handles.append(register_module_forward_pre_hook(self._pre_forward))
        resize, tracker = self._resize, self

        @wraps(resize)
        def resize_(storage: torch.UntypedStorage, size: int) -> None:
            resize(storage, size)
            known = tracker._entries.get(storage)
            if known is not None:
                tracker._follow_size(known[0], storage)

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]  (not seen by dispatch)
        return super().__enter__()

    def __exit__(self, *args: Any) -> None:
        torch.UntypedStorage.resize_ = self._resize  # type: ignore[method-assign]
        for handle in self._handles:
            handle.remove()
        for handles in self._hooked.values():
            for handle in handles:
                handle.remove()
        self._hooked = WeakIdKeyDictionary()
        if self._collector_was_on:
            gc.enable()
        super().__exit__(*args)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        result = func(*args, **(kwargs or {}))
        if isinstance(result, torch.Tensor):
            self._track_output(result)
        elif isinstance(result, (tuple, list)):
            for item in result:
                if isinstance(item, torch.Tensor):
                    self._track_output(item)
        return result
