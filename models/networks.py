"""Building blocks of the default models: MLP, CNN and LSTM encoders, with cleanrl's orthogonal init.

The forwards call torch functions directly instead of one nn.Module per layer: on small CPU batches
(the inference server's hot path) the per-module call overhead costs more than the matmuls.
"""

import math
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from rlgate.models.config import Activation, ConvFilter

HIDDEN_GAIN = math.sqrt(2)

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "tanh": torch.tanh,
    "relu": torch.relu,
    "swish": F.silu,
    "silu": F.silu,
    "elu": F.elu,
    "linear": lambda x: x,
}


_Layer = TypeVar("_Layer", nn.Linear, nn.Conv2d)


def _init(layer: _Layer, gain: float) -> _Layer:
    nn.init.orthogonal_(layer.weight, gain)
    assert layer.bias is not None  # built with one
    nn.init.zeros_(layer.bias)
    return layer


class MLP(nn.Module):
    """Linear layers, activated after each hidden layer; an optional linear output layer.

    Inputs of any numeric dtype are cast to float32. `out_gain` scales the output layer's init
    (cleanrl: 0.01 for a policy head, 1.0 for a value head).
    """

    def __init__(
        self,
        in_dim: int,
        hiddens: Sequence[int],
        activation: Activation,
        out_dim: int | None = None,
        out_gain: float = 1.0,
    ) -> None:
        super().__init__()
        dims = [in_dim, *hiddens]
        self.hidden = nn.ModuleList(_init(nn.Linear(a, b), HIDDEN_GAIN) for a, b in pairwise(dims))
        self.out = None if out_dim is None else _init(nn.Linear(dims[-1], out_dim), out_gain)
        self.out_dim = dims[-1] if out_dim is None else out_dim
        self._act = _ACTIVATIONS[activation]
        # The forward as data, (parameters, activation or None) per layer, run by `run_layers`: reading
        # `layer.weight` is a failed attribute lookup then nn.Module.__getattr__ (an exception raised and
        # caught), per parameter and call, which cost more than the matmuls at batch 1. The `_parameters`
        # dicts are read at each call, so parameters replaced (load_state_dict with assign=True) are used.
        linears = [*self.hidden, *([] if self.out is None else [self.out])]
        self.layers: tuple[Layer, ...] = tuple(
            (layer._parameters, self._act if i < len(self.hidden) else None) for i, layer in enumerate(linears)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return run_layers(self.layers, x)


#: One linear layer of `MLP.layers`: its parameters dict ("weight", "bias") and the activation after it, if any.
Layer = tuple[dict[str, Any], Callable[[torch.Tensor], torch.Tensor] | None]


def run_layers(layers: Sequence[Layer], x: torch.Tensor) -> torch.Tensor:
    """Linear layers one after the other, x cast to float32 first: MLP's forward, and the default module's
    sampling forward through its encoder and policy head at once (no nn.Module call per submodule)."""
    if x.dtype != torch.float32:
        x = x.float()
    linear = F.linear
    for params, act in layers:
        x = linear(x, params["weight"], params["bias"])
        if act is not None:
            x = act(x)
    return x


def torch_default_init(module: nn.Module) -> None:
    """Give every layer of `module` torch's own initialisation again, in place of cleanrl's orthogonal one (SB3's
    off-policy algorithms and a ModelConfig with `ortho_init = false`)."""
    for layer in module.modules():
        if isinstance(layer, nn.Linear | nn.Conv2d | nn.LSTM | nn.LSTMCell):
            layer.reset_parameters()


def _pair(size: int | tuple[int, int]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else size


def _same_padding(size: int, kernel: int, stride: int) -> tuple[int, int, int]:
    """TensorFlow's "same" padding: (pad before, pad after, output size) along one dimension."""
    out = math.ceil(size / stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2, out


class ImageTooSmall(ValueError):
    """Conv filters that leave nothing of the image ("valid" kernels larger than what is left of it)."""


class CNN(nn.Module):
    """Conv2D stack over channels-last images [N, H, W, C], flattened to [N, features].

    uint8 images (`scale=True`) are scaled to [0, 1].
    """

    def __init__(
        self,
        image_shape: tuple[int, int, int],
        filters: Sequence[ConvFilter],
        activation: Activation,
        scale: bool,
    ) -> None:
        super().__init__()
        height, width, channels = image_shape
        convs, pads = [], []
        for spec in filters:
            out_channels, kernel, stride = spec[:3]
            padding = spec[3] if len(spec) == 4 else "same"
            (kh, kw), (sh, sw) = _pair(kernel), _pair(stride)
            if padding == "same":
                top, bottom, height = _same_padding(height, kh, sh)
                left, right, width = _same_padding(width, kw, sw)
                pads.append((left, right, top, bottom))
            else:
                height, width = (height - kh) // sh + 1, (width - kw) // sw + 1
                pads.append((0, 0, 0, 0))
            if height < 1 or width < 1:
                raise ImageTooSmall(f"conv_filters {list(filters)} shrink the image {image_shape} to nothing")
            convs.append(_init(nn.Conv2d(channels, out_channels, (kh, kw), (sh, sw)), HIDDEN_GAIN))
            channels = out_channels
        self.convs = nn.ModuleList(convs)
        self._pads = pads
        self._act = _ACTIVATIONS[activation]
        self._scale = scale
        self.out_dim = height * width * channels

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.permute(0, 3, 1, 2).float()
        if self._scale:
            x = x / 255.0
        for conv, pad in zip(self.convs, self._pads, strict=True):
            x = self._act(conv(F.pad(x, pad) if any(pad) else x))
        return x.flatten(1)


class LSTMEncoder(nn.Module):
    """A feed-forward encoder (MLP or CNN) per time step, then one LSTM layer.

    forward(obs [B, T, ...], state {"h": [B, cell], "c": [B, cell]}) -> (features [B, T, cell], state out).
    """

    def __init__(self, base: MLP | CNN, cell_size: int) -> None:
        super().__init__()
        self.base = base
        self.lstm = nn.LSTM(base.out_dim, cell_size, batch_first=True)
        for name, param in self.lstm.named_parameters():
            if name.startswith("weight"):
                nn.init.orthogonal_(param, 1.0)
            else:
                nn.init.zeros_(param)
        self.out_dim = cell_size

    def forward(
        self, obs: torch.Tensor, state: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        batch, time = obs.shape[:2]
        x = self.base(obs.flatten(0, 1)).unflatten(0, (batch, time))
        x, (h, c) = self.lstm(x, (state["h"].unsqueeze(0), state["c"].unsqueeze(0)))
        return x, {"h": h.squeeze(0), "c": c.squeeze(0)}
