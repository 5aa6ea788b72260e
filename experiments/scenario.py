"""Records that describe one scenario: model, data, training, and how its failure shows.

A family's builder turns a severity into a :class:`Scenario`, plain data and no live object.
The runner builds the model, optimizer and batches from it and applies the knobs, so every
family answers every knob the same way.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = [
    "ArchConfig",
    "DataConfig",
    "TrainConfig",
    "OnsetRule",
    "Manifestation",
    "Scenario",
]


@dataclass(frozen=True, slots=True)
class ArchConfig:
    """The model of a scenario.

    Attributes
    ----------
    kind : {"mlp", "cnn", "resnet", "rnn", "transformer"}
        Architecture builder (see :mod:`experiments.architectures`).
    depth : int
        Hidden layers (mlp), conv layers (cnn), residual blocks (resnet), recurrent layers
        (rnn) or transformer blocks.
    width : int
        Hidden units, channels (cnn) or model dimension (transformer).
    activation : str
        Hidden activation (``relu``, ``leaky_relu``, ``gelu``, ``tanh``, ``sigmoid``).
    normalization : {"none", "batch", "layer"}
        Normalization after each hidden layer.
    init : {"default", "kaiming", "xavier", "constant"}
        Weight initialisation of Linear/Conv weights (``default`` keeps PyTorch's;
        ``constant`` fills every parameter with ``init_fill``).
    init_gain : float
        Multiplier on that initialisation's standard deviation (a family's init fault).
    bias_fill : tuple of (str, float)
        Module name and value: that module's bias is filled with the value after init.
    cell : {"gru", "lstm", "rnn", "rnn_relu"}
        Recurrent cell (rnn only); ``rnn`` is PyTorch's tanh Elman RNN, ``rnn_relu`` its ReLU
        variant.
    recurrent_init : {"default", "identity"}
        Recurrent weight matrices as PyTorch initialises them, or the identity (IRNN, Le et
        al. 2015) with zero recurrent bias.
    recurrent_gain : float
        Multiplier on the recurrent weight matrices after init (rnn only).
    heads : int
        Attention heads (transformer only).
    output : {"logits", "softmax", "sigmoid"}
        What the network ends with: its raw scores, or (a user's bug when the loss applies
        its own softmax or sigmoid) an ``nn.Softmax(dim=1)`` / ``nn.Sigmoid()`` module named
        ``prob`` after the last layer.
    init_fill : float or None
        ``init="constant"``: every weight and bias filled with this value (``p.fill_(0.01)``
        as users write it), plus ``init_noise`` times a standard normal draw when that is
        positive (symmetry broken by noise, the healthy look-alike).
    init_noise : float
        See ``init_fill``.
    detach_features : bool
        rnn/transformer: the features fed to the head are ``.detach()``-ed in ``forward``
        (a user's bug: the encoder below gets no gradient).
    """

    kind: Literal["mlp", "cnn", "resnet", "rnn", "transformer"]
    depth: int = 2
    width: int = 64
    activation: str = "relu"
    normalization: Literal["none", "batch", "layer"] = "none"
    init: Literal["default", "kaiming", "xavier", "constant"] = "default"
    init_gain: float = 1.0
    bias_fill: tuple[tuple[str, float], ...] = ()
    cell: Literal["gru", "lstm", "rnn", "rnn_relu"] = "gru"
    recurrent_init: Literal["default", "identity"] = "default"
    recurrent_gain: float = 1.0
    heads: int = 2
    output: Literal["logits", "softmax", "sigmoid"] = "logits"
    init_fill: float | None = None
    init_noise: float = 0.0
    detach_features: bool = False


@dataclass(frozen=True, slots=True)
class DataConfig:
    """The data of a scenario: a fixed pre-generated dataset, sampled into batches.

    Attributes
    ----------
    name : {"digits", "digits_image", "teacher", "sequence"}
        ``digits``: scikit-learn's bundled 8x8 digits as 64 features; ``digits_image``: the
        same as 1x8x8 images; ``teacher``: Gaussian inputs labelled by a random teacher
        network; ``sequence``: Gaussian sequences labelled by a projection of their mean.
    standardize : bool
        Standardise each feature (mean 0, std 1) as a careful user would.
    raw_scale : float
        Inputs multiplied by this after standardisation (an input-scale fault).
    offset : float
        Added to the inputs after scaling (a mean shift of unnormalised inputs).
    n_samples : int
        Samples generated (synthetic data only).
    n_features : int
        Input features per sample or per time step (synthetic data only).
    n_classes : int
        Classes (synthetic data only; digits has 10).
    seq_len : int
        Time steps (sequence data only).
    label_window : {"tail", "head", "all"}
        Sequence data: the label depends on the mean of the last 8 steps (``tail``, short
        memory), of the first 8 (``head``, a long-range dependency) or of all steps (``all``,
        an integration task).
    label_noise : float
        Share of labels replaced by random ones (fixed, part of the dataset).
    data_seed : int
        Seed of the dataset itself; runs with different seeds share the dataset.
    target : {"class", "regression"}
        ``regression`` (teacher data only): a continuous target, the teacher's score,
        standardised and then multiplied by ``target_scale`` and shifted by ``target_offset``
        (a price left in dollars); the model then has one output.
    target_scale, target_offset : float
        See ``target``.
    """

    name: Literal["digits", "digits_image", "teacher", "sequence"]
    standardize: bool = True
    raw_scale: float = 1.0
    offset: float = 0.0
    n_samples: int = 1024
    n_features: int = 32
    n_classes: int = 10
    seq_len: int = 16
    label_window: Literal["tail", "head", "all"] = "tail"
    label_noise: float = 0.0
    data_seed: int = 1234
    target: Literal["class", "regression"] = "class"
    target_scale: float = 1.0
    target_offset: float = 0.0


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """Optimisation of a scenario.

    Attributes
    ----------
    optimizer : {"sgd", "adam"}
        Optimizer class.
    lr : float
        Base learning rate (before the ``lr_scale`` knob).
    momentum : float
        SGD momentum.
    steps : int
        Training steps.
    batch_size : int
        Samples per batch, drawn with replacement by a generator seeded from the run seed.
    grad_clip : float or None
        Total gradient-norm clipping of the scenario (the ``grad_clip`` knob overrides it).
    lr_spike : tuple of (int, float, int) or None
        ``(step, factor, length)``: the learning rate multiplied by ``factor`` for ``length``
        steps from ``step`` (a schedule bug; ``lr_scale`` scales it too).
    loss : {"cross_entropy", "naive_cross_entropy", "mse", "bce_with_logits"}
        ``naive_cross_entropy`` computes ``log(sum(exp(z)))`` without subtracting the max,
        as a hand-written loss might; it overflows in float32 once a logit passes ~88.
        ``mse`` for regression targets; ``bce_with_logits`` on one-hot class targets (a
        multi-label style loss that applies its own sigmoid).
    noisy_batch_every : int or None
        Every this many steps, one batch has its labels shuffled (a benign loss spike).
    stop_after_nonfinite : int
        Steps trained after the first non-finite loss before the run stops.
    script : str
        The training step as the user wrote it, by name in :mod:`experiments.scripts`
        (``"standard"``: zero_grad, forward, backward, clip, step; others carry a bug).
    script_period : int
        A period the script reads (``zero_grad_per_epoch``: batches between resets).
    """

    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = 0.05
    momentum: float = 0.0
    steps: int = 200
    batch_size: int = 64
    grad_clip: float | None = None
    lr_spike: tuple[int, float, int] | None = None
    loss: Literal["cross_entropy", "naive_cross_entropy", "mse", "bce_with_logits"] = \
        "cross_entropy"
    noisy_batch_every: int | None = None
    stop_after_nonfinite: int = 10
    script: str = "standard"
    script_period: int = 1


@dataclass(frozen=True, slots=True)
class OnsetRule:
    """How the onset step of a run's failure is determined.

    Attributes
    ----------
    kind : {"fixed", "twin", "crossing", "nonfinite"}
        ``fixed``: the step is known by design (0 for a fault present from initialisation,
        the spike step for a learning-rate spike). ``twin``: the first step where a recorded
        statistic departs from the same statistic of the run's healthy twin (the family's
        baseline with the same seed, hence the same initialisation and batches) by
        ``margin`` in the failure direction; the runner trains the twin to measure it.
        ``crossing``: the first step where the statistic crosses ``threshold`` (times its
        value at step 0 when ``relative``). ``nonfinite``: the first non-finite loss.
        A non-finite value always counts as departed upwards.
    step : int or None
        The step for ``fixed``.
    statistic : str or None
        A column of ``trace.steps`` (``module`` None) or of ``trace.stats`` (with ``module``).
    module : str or None
        Module whose statistic is followed.
    threshold : float or None
        Crossing threshold (``crossing``).
    direction : {"above", "below"}
        The failure pushes the statistic up or down.
    relative : bool
        ``crossing`` threshold relative to the statistic's value at step 0 of the same run.
    scale : {"log", "linear"}
        ``twin``: compare log10 values or raw values.
    margin : float
        ``twin``: least departure (a factor of ``10**margin`` on the log scale).
    tolerance : int
        Steps within which a reported onset counts as a hit.
    """

    kind: Literal["fixed", "twin", "crossing", "nonfinite"]
    step: int | None = None
    statistic: str | None = None
    module: str | None = None
    threshold: float | None = None
    direction: Literal["above", "below"] = "above"
    relative: bool = False
    scale: Literal["log", "linear"] = "log"
    margin: float = 1.0
    tolerance: int = 5

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Manifestation:
    """A per-run statistic that tells the failure from its healthy baseline.

    Attributes
    ----------
    statistic : str
        Name in :data:`experiments.run_statistics.STATISTICS`.
    module : str or None
        Module the statistic is about, for per-module statistics.
    direction : {"greater", "less"}
        The failure makes the statistic greater or smaller than in healthy runs.
    scale : {"log", "linear"}
        ``log``: compared as log10 (ratios, norms); ``linear``: as is (shares).
    margin : float
        Least separation counted as a failure: a factor of ``10**margin`` on the log scale,
        an absolute difference on the linear scale.
    """

    statistic: str
    module: str | None = None
    direction: Literal["greater", "less"] = "greater"
    scale: Literal["log", "linear"] = "log"
    margin: float = 0.3

    @property
    def label(self) -> str:
        """``statistic`` or ``statistic@module``."""
        return self.statistic if self.module is None else f"{self.statistic}@{self.module}"

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Scenario:
    """Everything needed to train one scenario at one severity (no knobs applied yet).

    Attributes
    ----------
    arch : ArchConfig
    data : DataConfig
    train : TrainConfig
    origin_layers : tuple of str
        Acceptable origin layers (module names as ``named_modules()`` spells them); empty for
        a healthy scenario; every parameterised layer for a fault of the whole run.
    origin_scope : {"layer", "global", "none"}
        ``layer`` when the fault sits in named layers, ``global`` for a run-wide fault (the
        learning rate) where any listed layer is acceptable.
    onset : OnsetRule or None
        How the onset step is determined; None for a healthy scenario.
    manifestations : tuple of Manifestation
        Statistics that separate the failure from its baseline, the primary one first.
    """

    arch: ArchConfig
    data: DataConfig
    train: TrainConfig
    origin_layers: tuple[str, ...] = ()
    origin_scope: Literal["layer", "global", "none"] = "none"
    onset: OnsetRule | None = None
    manifestations: tuple[Manifestation, ...] = field(default_factory=tuple)
