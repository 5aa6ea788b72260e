"""Model builders of the zoo: MLP, CNN (with or without BatchNorm), residual MLP, GRU/LSTM/RNN
and a small Transformer.

Every builder reads activation and normalization from the :class:`ArchConfig`, so the
``activation`` and ``normalization`` knobs work on any family. Children carry readable
names (``fc1``, ``act1``, ``blocks.3.fc2``): the ground truth names origin layers the way
``named_modules()`` spells them.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
from torch import nn

from experiments.scenario import ArchConfig
from neuraldbg.knobs import ACTIVATIONS

__all__ = ["build_model", "make_activation", "make_norm", "ARCHITECTURES"]

#: Architecture kinds :func:`build_model` knows.
ARCHITECTURES: tuple[str, ...] = ("mlp", "cnn", "resnet", "rnn", "transformer")


def make_activation(name: str) -> nn.Module:
    """A fresh activation module by name (one of :data:`neuraldbg.knobs.ACTIVATIONS`)."""
    table = {
        "relu": nn.ReLU, "leaky_relu": lambda: nn.LeakyReLU(0.01), "gelu": nn.GELU,
        "tanh": nn.Tanh, "sigmoid": nn.Sigmoid,
    }
    if name not in table:
        raise ValueError(f"Unknown activation {name!r}. Valid activations are: {list(ACTIVATIONS)}")
    return table[name]()


class TokenBatchNorm(nn.BatchNorm1d):
    """BatchNorm over the feature (last) dimension of ``(batch, tokens, features)`` inputs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C)
        return super().forward(x.transpose(1, 2)).transpose(1, 2)


def make_norm(kind: str, dim: int, *, spatial: bool = False,
              tokens: bool = False) -> nn.Module | None:
    """Normalization module for ``dim`` features (None for ``"none"``).

    Parameters
    ----------
    kind : {"none", "batch", "layer"}
    dim : int
        Features or channels.
    spatial : bool, default=False
        Conv feature maps ``(B, C, H, W)``: BatchNorm2d, or GroupNorm(1, C) for "layer".
    tokens : bool, default=False
        Token sequences ``(B, T, C)``: BatchNorm over C for "batch".
    """
    if kind == "none":
        return None
    if kind == "batch":
        if spatial:
            return nn.BatchNorm2d(dim)
        return TokenBatchNorm(dim) if tokens else nn.BatchNorm1d(dim)
    if kind == "layer":
        return nn.GroupNorm(1, dim) if spatial else nn.LayerNorm(dim)
    raise ValueError(f"Unknown normalization {kind!r}. Valid values are: "
                     "['batch', 'layer', 'none']")


def _mlp(arch: ArchConfig, d_in: int, n_classes: int) -> nn.Module:
    layers: list[tuple[str, nn.Module]] = []
    d = d_in
    for i in range(1, arch.depth + 1):
        layers.append((f"fc{i}", nn.Linear(d, arch.width)))
        norm = make_norm(arch.normalization, arch.width)
        if norm is not None:
            layers.append((f"norm{i}", norm))
        layers.append((f"act{i}", make_activation(arch.activation)))
        d = arch.width
    layers.append(("out", nn.Linear(d, n_classes)))
    layers += _output_module(arch)
    return nn.Sequential(OrderedDict(layers))


def _output_module(arch: ArchConfig) -> list[tuple[str, nn.Module]]:
    """The user's probability layer after the logits (``arch.output``), if any."""
    if arch.output == "logits":
        return []
    if arch.output == "softmax":
        return [("prob", nn.Softmax(dim=1))]
    if arch.output == "sigmoid":
        return [("prob", nn.Sigmoid())]
    raise ValueError(f"Unknown output {arch.output!r}. Valid values are: "
                     "['logits', 'sigmoid', 'softmax']")


def _cnn(arch: ArchConfig, shape: tuple[int, ...], n_classes: int) -> nn.Module:
    c, h, w = shape
    layers: list[tuple[str, nn.Module]] = []
    for i in range(1, arch.depth + 1):
        layers.append((f"conv{i}", nn.Conv2d(c, arch.width, 3, padding=1)))
        norm = make_norm(arch.normalization, arch.width, spatial=True)
        if norm is not None:
            layers.append((f"norm{i}", norm))
        layers.append((f"act{i}", make_activation(arch.activation)))
        if i <= 2 and h >= 4:
            layers.append((f"pool{i}", nn.MaxPool2d(2)))
            h, w = h // 2, w // 2
        c = arch.width
    layers.append(("flatten", nn.Flatten()))
    layers.append(("fc", nn.Linear(c * h * w, 64)))
    norm = make_norm(arch.normalization, 64)
    if norm is not None:
        layers.append(("fc_norm", norm))
    layers.append(("fc_act", make_activation(arch.activation)))
    layers.append(("out", nn.Linear(64, n_classes)))
    layers += _output_module(arch)
    return nn.Sequential(OrderedDict(layers))


class ResidualBlock(nn.Module):
    """``x + fc2(act(norm(fc1(x))))``: without normalization the residual stream grows
    multiplicatively with depth under He initialisation."""

    def __init__(self, width: int, activation: str, normalization: str) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        norm = make_norm(normalization, width)
        if norm is not None:
            self.norm = norm
        self.act = make_activation(activation)
        self.fc2 = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        if hasattr(self, "norm"):
            h = self.norm(h)
        return x + self.fc2(self.act(h))


class ResidualMLP(nn.Module):
    """Stem, ``depth`` residual blocks, linear head."""

    def __init__(self, arch: ArchConfig, d_in: int, n_classes: int) -> None:
        super().__init__()
        self.stem = nn.Linear(d_in, arch.width)
        self.blocks = nn.ModuleList(
            ResidualBlock(arch.width, arch.activation, arch.normalization)
            for _ in range(arch.depth)
        )
        self.out = nn.Linear(arch.width, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


class RecurrentNet(nn.Module):
    """A GRU, LSTM or Elman RNN (tanh or ReLU) over the sequence; the last hidden state feeds
    an MLP head.

    The ``activation`` knob replaces the head's activation; the gates inside the recurrent
    cell keep theirs (PyTorch's fused cells do not expose them as modules).
    """

    def __init__(self, arch: ArchConfig, d_in: int, n_classes: int) -> None:
        super().__init__()
        if arch.cell == "rnn_relu":
            self.rnn: nn.Module = nn.RNN(d_in, arch.width, nonlinearity="relu", batch_first=True)
        else:
            cls = {"gru": nn.GRU, "lstm": nn.LSTM, "rnn": nn.RNN}[arch.cell]
            self.rnn = cls(d_in, arch.width, num_layers=1, batch_first=True)
        if arch.recurrent_init == "identity":
            with torch.no_grad():
                for name, p in self.rnn.named_parameters():
                    if name.startswith("weight_hh"):
                        rows = p.shape[0] // arch.width
                        p.copy_(torch.eye(arch.width).repeat(rows, 1))
                    elif name.startswith("bias_hh"):
                        p.zero_()
        norm = make_norm(arch.normalization, arch.width)
        if norm is not None:
            self.norm = norm
        self.fc = nn.Linear(arch.width, arch.width)
        self.act = make_activation(arch.activation)
        self.out = nn.Linear(arch.width, n_classes)
        self.detach_features = arch.detach_features
        for name, mod in _output_module(arch):
            self.add_module(name, mod)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, d)
        seq, _ = self.rnn(x)
        h = seq[:, -1]
        if self.detach_features:  # the user's bug: the recurrent layer gets no gradient
            h = h.detach()
        if hasattr(self, "norm"):
            h = self.norm(h)
        y = self.out(self.act(self.fc(h)))
        return self.prob(y) if hasattr(self, "prob") else y


class TransformerBlock(nn.Module):
    """Pre-norm self-attention and MLP; the attention softmax is a module so its saturation
    is recorded."""

    def __init__(self, width: int, heads: int, activation: str, normalization: str) -> None:
        super().__init__()
        self.heads = heads
        n1 = make_norm(normalization, width, tokens=True)
        if n1 is not None:
            self.norm1 = n1
        self.qkv = nn.Linear(width, 3 * width)
        self.attn_softmax = nn.Softmax(dim=-1)
        self.proj = nn.Linear(width, width)
        n2 = make_norm(normalization, width, tokens=True)
        if n2 is not None:
            self.norm2 = n2
        self.fc1 = nn.Linear(width, 2 * width)
        self.act = make_activation(activation)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C)
        b, t, c = x.shape
        h = self.norm1(x) if hasattr(self, "norm1") else x
        q, k, v = self.qkv(h).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        att = self.attn_softmax(q @ k.transpose(-2, -1) / math.sqrt(c // self.heads))
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        h = self.norm2(x) if hasattr(self, "norm2") else x
        return x + self.fc2(self.act(self.fc1(h)))


class TinyTransformer(nn.Module):
    """Linear embedding of continuous tokens, learned positions, ``depth`` blocks, mean pool."""

    def __init__(self, arch: ArchConfig, seq_len: int, d_in: int, n_classes: int) -> None:
        super().__init__()
        self.embed = nn.Linear(d_in, arch.width)
        self.pos = nn.Parameter(torch.zeros(1, seq_len, arch.width))
        self.blocks = nn.ModuleList(
            TransformerBlock(arch.width, arch.heads, arch.activation, arch.normalization)
            for _ in range(arch.depth)
        )
        nf = make_norm(arch.normalization, arch.width, tokens=True)
        if nf is not None:
            self.norm_f = nf
        self.out = nn.Linear(arch.width, n_classes)
        self.detach_features = arch.detach_features
        for name, mod in _output_module(arch):
            self.add_module(name, mod)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, d)
        h = self.embed(x) + self.pos
        if self.detach_features:  # the user's bug: the embedding gets no gradient
            h = h.detach()
        for block in self.blocks:
            h = block(h)
        if hasattr(self, "norm_f"):
            h = self.norm_f(h)
        y = self.out(h.mean(dim=1))
        return self.prob(y) if hasattr(self, "prob") else y


def _fill_constant(model: nn.Module, arch: ArchConfig) -> None:
    """``p.fill_(value)`` on every parameter, as users write it (plus optional noise)."""
    if arch.init_fill is None:
        raise ValueError("init='constant' needs init_fill, the value every parameter is "
                         "filled with, e.g. ArchConfig(..., init='constant', init_fill=0.01).")
    for p in model.parameters():
        p.fill_(arch.init_fill)
        if arch.init_noise > 0:
            p.add_(torch.randn_like(p) * arch.init_noise)


def _initialise(model: nn.Module, arch: ArchConfig) -> None:
    with torch.no_grad():
        if arch.init == "constant":
            _fill_constant(model, arch)
        elif arch.init != "default":
            for mod in model.modules():
                if isinstance(mod, (nn.Linear, nn.Conv2d)):
                    if arch.init == "kaiming":
                        nn.init.kaiming_normal_(mod.weight, nonlinearity="relu")
                    elif arch.init == "xavier":
                        nn.init.xavier_normal_(mod.weight)
                    else:
                        raise ValueError(f"Unknown init {arch.init!r}. Valid values are: "
                                         "['constant', 'default', 'kaiming', 'xavier']")
                    if mod.bias is not None:
                        mod.bias.zero_()
        if arch.init_gain != 1.0:
            for p in model.parameters():
                if p.ndim >= 2:
                    p.mul_(arch.init_gain)
        if arch.recurrent_gain != 1.0:
            for name, p in model.named_parameters():
                if "weight_hh" in name:
                    p.mul_(arch.recurrent_gain)
        modules = dict(model.named_modules())
        for name, value in arch.bias_fill:
            if name not in modules or getattr(modules[name], "bias", None) is None:
                valid = [n for n, m in modules.items() if getattr(m, "bias", None) is not None]
                raise ValueError(f"bias_fill names {name!r}, which is not a module with a bias. "
                                 f"Modules with a bias: {valid}")
            modules[name].bias.fill_(value)


def build_model(arch: ArchConfig, input_shape: tuple[int, ...], n_classes: int) -> nn.Module:
    """Build and initialise the model of ``arch`` (draws from torch's global generator).

    Parameters
    ----------
    arch : ArchConfig
    input_shape : tuple of int
        Shape of one sample: ``(d,)``, ``(c, h, w)`` or ``(seq_len, d)``.
    n_classes : int

    Returns
    -------
    torch.nn.Module

    Raises
    ------
    ValueError
        For an unknown kind, activation, normalization or init, or a shape the kind cannot take.
    """
    if arch.activation not in ACTIVATIONS:
        raise ValueError(f"Unknown activation {arch.activation!r}. Valid activations are: "
                         f"{list(ACTIVATIONS)}")
    kind = arch.kind
    if kind in ("mlp", "resnet") and len(input_shape) != 1:
        raise ValueError(f"{kind} takes flat inputs (d,), got a sample shape {input_shape}.")
    if kind == "cnn" and len(input_shape) != 3:
        raise ValueError(f"cnn takes images (c, h, w), got a sample shape {input_shape}.")
    if kind in ("rnn", "transformer") and len(input_shape) != 2:
        raise ValueError(f"{kind} takes sequences (seq_len, d), got a sample shape {input_shape}.")
    if kind == "mlp":
        model: nn.Module = _mlp(arch, input_shape[0], n_classes)
    elif kind == "cnn":
        model = _cnn(arch, tuple(input_shape), n_classes)
    elif kind == "resnet":
        model = ResidualMLP(arch, input_shape[0], n_classes)
    elif kind == "rnn":
        model = RecurrentNet(arch, input_shape[1], n_classes)
    elif kind == "transformer":
        model = TinyTransformer(arch, input_shape[0], input_shape[1], n_classes)
    else:
        raise ValueError(f"Unknown architecture {kind!r}. Valid kinds are: {list(ARCHITECTURES)}")
    if arch.detach_features and kind not in ("rnn", "transformer"):
        raise ValueError(f"detach_features is a bug of the rnn and transformer models, got "
                         f"kind={kind!r}.")
    if arch.output != "logits" and kind == "resnet":
        raise ValueError("output='softmax'/'sigmoid' is not built for the resnet kind; use "
                         "mlp, cnn, rnn or transformer.")
    _initialise(model, arch)
    return model
