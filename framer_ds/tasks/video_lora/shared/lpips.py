"""LPIPS (Zhang et al. 2018, "The Unreasonable Effectiveness of Deep Features as a Perceptual Metric")
from two local files, in plain PyTorch: nothing is downloaded and torchvision is not needed.

Why our own module: the `lpips` package and torchmetrics' LPIPS both build the backbone through
torchvision (a hard requirement of both) and fetch its ImageNet weights from the internet. This module
is the `lpips` package's v0.1 network (`lpips.LPIPS(net='alex'|'vgg')`) with the layer indices of
torchvision's `alexnet().features` / `vgg16().features`, so both published files load as they are:

- the backbone: torchvision's ImageNet state dict (`alexnet-owt-7be5be79.pth`, `vgg16-397923af.pth`):
  keys `features.N.weight` / `features.N.bias` (the `classifier.*` keys are ignored);
- the calibration: the `lpips` wheel's `lpips/weights/v0.1/alex.pth` (or `vgg.pth`): keys
  `lin{k}.model.1.weight`, one [1, C_k, 1, 1] 1x1 convolution per tapped layer.

The distance of two images x, y in [-1, 1]: both are shifted and scaled per channel (`ScalingLayer`),
run through the backbone, and at each tapped ReLU k the features are unit-normalised over channels
(`f / (||f|| + 1e-10)`); the squared difference is weighted per channel by lin_k and averaged over the
pixels; LPIPS is the sum over the layers. 0 for identical images, larger = more different.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

# torchvision's `features` Sequential: ("conv", in, out, kernel, stride, padding) | ("relu",) | ("pool", k, s)
_ALEX = [
    ("conv", 3, 64, 11, 4, 2), ("relu",), ("pool", 3, 2),
    ("conv", 64, 192, 5, 1, 2), ("relu",), ("pool", 3, 2),
    ("conv", 192, 384, 3, 1, 1), ("relu",),
    ("conv", 384, 256, 3, 1, 1), ("relu",),
    ("conv", 256, 256, 3, 1, 1), ("relu",),
]  # fmt: skip


def _vgg16() -> list[tuple]:
    layers: list[tuple] = []
    channels = 3
    for block, (width, convs) in enumerate(((64, 2), (128, 2), (256, 3), (512, 3), (512, 3))):
        if block:
            layers.append(("pool", 2, 2))
        for _ in range(convs):
            layers += [("conv", channels, width, 3, 1, 1), ("relu",)]
            channels = width
    return layers


# net -> (layers, indices whose outputs are tapped, their channels); the lpips package's slices
NETS = {
    "alex": (_ALEX, (1, 4, 7, 9, 11), (64, 192, 384, 256, 256)),
    "vgg": (_vgg16(), (3, 8, 15, 22, 29), (64, 128, 256, 512, 512)),
}
SHIFT = (-0.030, -0.088, -0.188)  # lpips.ScalingLayer (v0.1)
SCALE = (0.458, 0.448, 0.450)
EPS = 1e-10


def _layer(spec: tuple) -> nn.Module:
    if spec[0] == "conv":
        _, c_in, c_out, kernel, stride, padding = spec
        return nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=padding)
    if spec[0] == "relu":
        return nn.ReLU()
    return nn.MaxPool2d(kernel_size=spec[1], stride=spec[2])


class Lpips(nn.Module):
    """LPIPS v0.1 with an AlexNet or VGG16 backbone; `forward(x, y)` -> [N] for [N, 3, H, W] in [-1, 1]."""

    def __init__(self, net: str = "alex"):
        super().__init__()
        if net not in NETS:
            raise ValueError(f"LPIPS backbone {net!r}: expected one of {', '.join(NETS)}")
        layers, self.taps, channels = NETS[net]
        self.net = net
        self.features = nn.Sequential(*(_layer(spec) for spec in layers[: self.taps[-1] + 1]))
        self.lins = nn.ModuleList(nn.Conv2d(c, 1, 1, bias=False) for c in channels)
        self.register_buffer("shift", torch.tensor(SHIFT).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("scale", torch.tensor(SCALE).view(1, 3, 1, 1), persistent=False)
        self.requires_grad_(False).eval()

    def tapped(self, x: Tensor) -> list[Tensor]:
        out, h = [], (x - self.shift) / self.scale
        for index, layer in enumerate(self.features):
            h = layer(h)
            if index in self.taps:
                out.append(h)
        return out

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        total = x.new_zeros(x.shape[0])
        for lin, fx, fy in zip(self.lins, self.tapped(x), self.tapped(y), strict=True):
            nx = fx / (fx.pow(2).sum(dim=1, keepdim=True).sqrt() + EPS)
            ny = fy / (fy.pow(2).sum(dim=1, keepdim=True).sqrt() + EPS)
            total = total + lin((nx - ny).pow(2)).mean(dim=(1, 2, 3))
        return total


def _read(path: Path) -> dict[str, Tensor]:
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(path)
    return torch.load(path, map_location="cpu", weights_only=True)


def load_lpips(weights: Path, backbone: Path) -> Lpips:
    """`weights`: the lpips package's calibration file (`weights/v0.1/alex.pth` or `vgg.pth`), whose
    channel counts say which backbone it calibrates; `backbone`: torchvision's ImageNet state dict of
    that network. Both load strictly (every layer present, every shape right)."""
    lin_state = _read(weights)
    lin_keys = sorted(k for k in lin_state if k.startswith("lin"))
    channels = tuple(int(lin_state[k].shape[1]) for k in lin_keys)
    net = next((name for name, (_, _, c) in NETS.items() if c == channels), None)
    if net is None:
        raise ValueError(
            f"{weights}: not an lpips v0.1 calibration file for alex or vgg (lin layers of {channels} "
            "channels); use the lpips wheel's lpips/weights/v0.1/alex.pth or vgg.pth"
        )
    model = Lpips(net)
    model.lins.load_state_dict({k.replace(".model.1", "")[3:]: lin_state[k] for k in lin_keys})  # 0.weight
    features = {  # torchvision's layers past the last tap (VGG's final pool) have no weights
        k.removeprefix("features."): v for k, v in _read(backbone).items() if k.startswith("features.")
    }
    try:
        model.features.load_state_dict(features, strict=True)
    except RuntimeError as error:
        raise ValueError(
            f"{backbone}: not torchvision's {'alexnet' if net == 'alex' else 'vgg16'} state dict "
            f"(features.N.weight/bias), which {weights} calibrates: {error}"
        ) from error
    return model
