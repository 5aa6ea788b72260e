"""Bugs in the training script, as users write them: gradients never reset, a probability
layer before a loss that applies its own, regression targets left in their raw units, a
constant initialisation, labels unrelated to the inputs, an SGD-sized learning rate given to
Adam, a model left in ``eval()`` and a detached tensor that starves a layer of gradient.

Each family's bug sits in the user's code (:mod:`experiments.scripts` for the training step,
the model's own ``forward`` or initialisation, the data), never in a knob, so the knobs remain
the interventions a user could try. A family whose bug is on or off grades its severity by the
learning rate the buggy script runs at (the bug shows at every rate); severity 0 is the clean
script. Sources: Humbatova et al., "Taxonomy of Real Faults in Deep Learning Systems", ICSE
2020; Islam et al., FSE 2019; Zhang et al., ISSTA 2018; the PyTorch forums.
"""

from __future__ import annotations

from dataclasses import replace

from experiments.families import register_family
from experiments.scenario import (ArchConfig, DataConfig, OnsetRule, Scenario, Manifestation,
                                  TrainConfig)

__all__: list[str] = []

_PLATEAU = Manifestation("loss_ratio", direction="greater", scale="log", margin=0.15)


def _lr_graded(train: TrainConfig, severity: float, **bug: object) -> TrainConfig:
    """The buggy script at ``severity`` x the base rate; severity 0: the clean script."""
    if severity == 0:
        return train
    return replace(train, lr=train.lr * severity, **bug)


# --- gradients never reset --------------------------------------------------------------

@register_family(
    name="zero_grad_per_epoch_mlp",
    kind="failure",
    architecture="MLP",
    data="digits",
    description="A ReLU MLP (SGD, momentum 0.9) whose loop calls opt.zero_grad() once per "
                "epoch of `severity` batches instead of once per batch: the gradient is a "
                "running sum of every step since the reset, its norm grows step after step "
                "and the loss does not improve. Severity 1 is the correct loop.",
    default_severity=1000.0,
    severities=(5.0, 20.0, 1000.0),
    baseline_severity=1.0,
    failure_type="exploding_gradients",
    root_cause="missing_zero_grad",
    code_fix="call opt.zero_grad() before every backward",
    counterfactuals=(
        {"knobs": {"lr_scale": 0.1}, "expected": "exploding_gradients"},
    ),
)
def _zero_grad_mlp(severity: float) -> Scenario:
    return Scenario(
        arch=ArchConfig("mlp", depth=2, width=32, activation="relu"),
        data=DataConfig("digits"),
        train=TrainConfig(lr=0.05, momentum=0.9, steps=120, script="zero_grad_per_epoch",
                          script_period=int(severity)),
        origin_scope="global",
        # The sum starts at step 1; the norm leaves the healthy runs' envelope by 10x at
        # steps 15-18 (SGD) and 30-35 (Adam) on seeds 0-2, hence the wide tolerance.
        onset=OnsetRule("fixed", step=0, tolerance=40),
        manifestations=(Manifestation("grad_growth", direction="greater", scale="log", margin=1.0),
                  _PLATEAU),
    )


@register_family(
    name="zero_grad_per_epoch_cnn_adam",
    kind="failure",
    architecture="CNN",
    data="digits_image",
    description="A small CNN under Adam whose loop resets the gradients once per epoch of "
                "`severity` batches: Adam normalises the update, but its direction is the "
                "running sum of every gradient since the reset, which stops tracking the "
                "current batch, and the loss does not improve. Severity 1 is the correct loop.",
    default_severity=1000.0,
    severities=(5.0, 20.0, 1000.0),
    baseline_severity=1.0,
    failure_type="exploding_gradients",
    root_cause="missing_zero_grad",
    code_fix="call opt.zero_grad() before every backward",
    counterfactuals=(
        # a lower rate tames the growth but the loss still does not improve
        {"knobs": {"lr_scale": 0.1}, "expected": "training_plateau"},
    ),
)
def _zero_grad_cnn_adam(severity: float) -> Scenario:
    return Scenario(
        arch=ArchConfig("cnn", depth=2, width=8, activation="relu"),
        data=DataConfig("digits_image"),
        train=TrainConfig(optimizer="adam", lr=3e-3, steps=100, script="zero_grad_per_epoch",
                          script_period=int(severity)),
        origin_scope="global",
        # The sum starts at step 1; the norm leaves the healthy runs' envelope by 10x at
        # steps 15-18 (SGD) and 30-35 (Adam) on seeds 0-2, hence the wide tolerance.
        onset=OnsetRule("fixed", step=0, tolerance=40),
        manifestations=(Manifestation("grad_growth", direction="greater", scale="log", margin=1.0),
                  _PLATEAU),
    )


# --- a probability layer before a loss that applies its own --------------------------------

@register_family(
    name="softmax_before_ce_mlp",
    kind="failure",
    architecture="MLP",
    data="digits",
    description="A ReLU MLP ending in nn.Softmax(dim=1), trained with F.cross_entropy, which "
                "applies its own log-softmax: the loss sees probabilities as logits, its "
                "gradient is squashed by the softmax's Jacobian and the loss stalls far above "
                "what the model could reach. Severity: the learning-rate multiplier the buggy "
                "model trains at (lowering or raising the rate does not help); 0 is the "
                "model without the softmax.",
    default_severity=1.0,
    severities=(0.3, 1.0, 3.0),
    baseline_severity=0.0,
    failure_type="training_plateau",
    root_cause="loss_output_mismatch",
    code_fix="remove the probability layer: the loss applies its own softmax/sigmoid",
    counterfactuals=(
        {"knobs": {"lr_scale": 0.1}, "expected": "training_plateau"},
    ),
)
def _softmax_before_ce_mlp(severity: float) -> Scenario:
    return Scenario(
        arch=ArchConfig("mlp", depth=2, width=32, activation="relu",
                        output="softmax" if severity > 0 else "logits"),
        data=DataConfig("digits"),
        train=_lr_graded(TrainConfig(lr=0.02, momentum=0.9, steps=120), severity),
        origin_scope="global",
        onset=OnsetRule("fixed", step=0, tolerance=120),
        manifestations=(_PLATEAU,),
    )


@register_family(
    name="softmax_before_ce_cnn",
    kind="failure",
    architecture="CNN",
    data="digits_image",
    description="A CNN ending in nn.Softmax(dim=1) before nn.CrossEntropyLoss, SGD: the "
                "softmax is applied twice and the loss stalls. Severity: the learning-rate "
                "multiplier of the buggy model; 0 is the model without the softmax.",
    default_severity=1.0,
    severities=(0.3, 1.0, 3.0),
    baseline_severity=0.0,
    failure_type="training_plateau",
    root_cause="loss_output_mismatch",
    code_fix="remove the probability layer: the loss applies its own softmax/sigmoid",
    counterfactuals=(
        {"knobs": {"lr_scale": 0.1}, "expected": "training_plateau"},
    ),
)
def _softmax_before_ce_cnn(severity: float) -> Scenario:
    return Scenario(
        arch=ArchConfig("cnn", depth=2, width=8, activation="relu",
                        output="softmax" if severity > 0 else "logits"),
        data=DataConfig("digits_image"),
        train=_lr_graded(TrainConfig(lr=0.05, momentum=0.9, steps=120), severity),
        origin_scope="global",
        onset=OnsetRule("fixed", step=0, tolerance=120),
        manifestations=(_PLATEAU,),
    )


# --- regression targets far off the output scale -----------------------------------------

@register_family(
    name="unscaled_targets_mlp",
    kind="failure",
    architecture="MLP",
    data="teacher",
    description="A regression MLP (Adam, MSE) on a target left in its raw units: the "
                "teacher's score times the severity plus 3x the severity (a price in "
                "dollars). The network's outputs start near 0 and Adam moves them by about "
                "the learning rate per step: the loss starts orders of magnitude above the "
                "output scale and barely moves. Severity 1 is the standardised target.",
    default_severity=1000.0,
    severities=(30.0, 300.0, 1000.0),
    baseline_severity=1.0,
    failure_type="training_plateau",
    root_cause="unscaled_targets",
    code_fix="standardise the targets (and undo it on the predictions)",
    counterfactuals=(
        {"knobs": {"lr_scale": 0.1}, "expected": "training_plateau"},
    ),
)
def _unscaled_targets(severity: float) -> Scenario:
    return Scenario(
        arch=ArchConfig("mlp", depth=2, width=32, activation="relu"),
        data=DataConfig("teacher", target="regression", target_scale=severity,
                        target_offset=3.0 * severity if severity > 1 else 0.0),
        train=TrainConfig(optimizer="adam", lr=1e-3, steps=120, loss="mse"),
        origin_scope="global",
        onset=OnsetRule("fixed", step=0, tolerance=120),
        manifestations=(_PLATEAU,),
    )


# --- constant initialisation -------------------------------------------------------------

@register_family(
    name="constant_init_mlp",
    kind="failure",
    architecture="MLP",
    data="digits",
    description="A ReLU MLP whose every parameter the user filled with the severity "
                "(`p.data.fill_(0.01)`): every hidden unit computes the same value; the "
                "output rows are equal, so the gradient reaching the hidden layers (their sum "
                "against a softmax error that sums to zero) vanishes, the units stay copies of "
                "each other and the loss stalls. "
                "Severity 0 is PyTorch's default initialisation.",
    default_severity=0.01,
    severities=(0.001, 0.01, 0.1),
    baseline_severity=0.0,
    failure_type="vanishing_gradients",
    root_cause="symmetric_init",
    code_fix="keep PyTorch's random initialisation (or add noise that breaks the symmetry)",
    counterfactuals=(
        {"knobs": {"lr_scale": 10.0}, "expected": "vanishing_gradients"},
    ),
)
def _constant_init_mlp(severity: float) -> Scenario:
    init = {"init": "constant", "init_fill": severity} if severity > 0 else {}
    return Scenario(
        arch=ArchConfig("mlp", depth=3, width=32, activation="relu", **init),
        data=DataConfig("digits"),
        train=TrainConfig(lr=0.05, momentum=0.9, steps=120),
        origin_scope="global",
        onset=OnsetRule("fixed", step=0, tolerance=120),
        manifestations=(_PLATEAU,),
    )


@register_family(
    name="constant_init_cnn",
    kind="failure",
    architecture="CNN",
    data="digits_image",
    description="A CNN whose every parameter the user filled with the severity: every "
                "channel and hidden unit stays a copy of the others, the gradient reaching "
                "them vanishes and the loss stalls. "
                "Severity 0 is PyTorch's default initialisation.",
    default_severity=0.01,
    severities=(0.001, 0.01, 0.1),
    baseline_severity=0.0,
    failure_type="vanishing_gradients",
    root_cause="symmetric_init",
    code_fix="keep PyTorch's random initialisation (or add noise that breaks the symmetry)",
    counterfactuals=(
        {"knobs": {"lr_scale": 10.0}, "expected": "vanishing_gradients"},
    ),
)
def _constant_init_cnn(severity: float) -> Scenario:
    init = {"init": "constant", "init_fill": severity} if severity > 0 else {}
    return Scenario(
        arch=ArchConfig("cnn", depth=2, width=8, activation="relu", **init),
        data=DataConfig("digits_image"),
        train=TrainConfig(lr=0.05, momentum=0.9, steps=100),
        origin_scope="global",
        onset=OnsetRule("fixed", step=0, tolerance=100),
        manifestations=(_PLATEAU,),
    )


@register_family(
    name="constant_init_transformer",
    kind="failure",
    architecture="Transformer",
    data="sequence",
    description="A small Transformer (Adam) whose every parameter the user filled with the "
                "severity: every token, head and unit computes the same value, LayerNorm "
                "maps the constant vectors to its bias and passes no gradient back through "
                "them: the gradient vanishes below it and the loss stalls. Severity 0 is "
                "PyTorch's default initialisation.",
    default_severity=0.01,
    severities=(0.001, 0.01, 0.1),
    baseline_severity=0.0,
    failure_type="vanishing_gradients",
    root_cause="symmetric_init",
    code_fix="keep PyTorch's random initialisation (or add noise that breaks the symmetry)",
    counterfactuals=(
        {"knobs": {"lr_scale": 3.0}, "expected": "vanishing_gradients"},
    ),
)
def _constant_init_transformer(severity: float) -> Scenario:
    init = {"init": "constant", "init_fill": severity} if severity > 0 else {}
    return Scenario(
        arch=ArchConfig("transformer", depth=1, width=16, activation="gelu",
                        normalization="layer", heads=2, **init),
        data=DataConfig("sequence", n_features=8, n_classes=4, seq_len=12),
        train=TrainConfig(optimizer="adam", lr=3e-3, steps=100, batch_size=32),
        origin_scope="global",
        onset=OnsetRule("fixed", step=0, tolerance=100),
        manifestations=(_PLATEAU,),
    )


# --- labels unrelated to the inputs ------------------------------------------------------

@register_family(
    name="shuffled_labels_mlp",
    kind="failure",
    architecture="MLP",
    data="digits",
    description="A ReLU MLP on digits whose labels were shuffled apart from their images (a "
                "share of them given by the severity; a misaligned join, a shuffle of one "
                "array and not the other): gradients and updates are healthy, the loss stays "
                "at chance. Severity 0 is the aligned data.",
    default_severity=1.0,
    severities=(0.5, 0.8, 1.0),
    baseline_severity=0.0,
    failure_type="training_plateau",
    root_cause="data_problem",
    code_fix="keep each label with its input (shuffle both arrays with one permutation)",
    counterfactuals=(
        {"knobs": {"lr_scale": 0.1}, "expected": "training_plateau"},
    ),
)
def _shuffled_labels_mlp(severity: float) -> Scenario:
    return Scenario(
        arch=ArchConfig("mlp", depth=2, width=32, activation="relu"),
        data=DataConfig("digits", label_noise=severity),
        train=TrainConfig(lr=0.05, momentum=0.9, steps=120),
        origin_scope="global",
        onset=OnsetRule("fixed", step=0, tolerance=120),
        manifestations=(_PLATEAU,),
    )


@register_family(
    name="shuffled_labels_gru",
    kind="failure",
    architecture="GRU",
    data="sequence",
    description="A GRU (Adam) on sequences whose labels were shuffled apart from them (the "
                "share given by the severity): healthy gradients, a loss at chance. Severity "
                "0 is the aligned data.",
    default_severity=1.0,
    severities=(0.5, 0.8, 1.0),
    baseline_severity=0.0,
    failure_type="training_plateau",
    root_cause="data_problem",
    code_fix="keep each label with its input (shuffle both arrays with one permutation)",
    counterfactuals=(
        {"knobs": {"lr_scale": 3.0}, "expected": "training_plateau"},
    ),
)
def _shuffled_labels_gru(severity: float) -> Scenario:
    return Scenario(
        arch=ArchConfig("rnn", width=16, activation="tanh", cell="gru"),
        data=DataConfig("sequence", n_features=8, n_classes=4, seq_len=12,
                        label_noise=severity),
        train=TrainConfig(optimizer="adam", lr=1e-2, steps=100, batch_size=32),
        origin_scope="global",
        onset=OnsetRule("fixed", step=0, tolerance=100),
        manifestations=(_PLATEAU,),
    )


# --- Adam given an SGD-sized learning rate -----------------------------------------------

@register_family(
    name="adam_sgd_lr_lstm",
    kind="failure",
    architecture="LSTM",
    data="sequence",
    description="An LSTM under Adam given the learning rate the user had for SGD (the "
                "severity; 1e-3 to 3e-3 is Adam's usual range): every weight moves by about "
                "the rate at each step, the head's pre-activations are thrown far out and its "
                "tanh units saturate for most samples. The baseline is Adam at 3e-3.",
    default_severity=1.0,
    severities=(0.1, 0.3, 1.0),
    baseline_severity=0.003,
    failure_type="saturated_activations",
    root_cause="learning_rate_too_high",
    canonical_fix={"lr_scale": 0.003},
    counterfactuals=(
        {"knobs": {"grad_clip": 1.0}, "expected": "saturated_activations"},
    ),
)
def _adam_sgd_lr_lstm(severity: float) -> Scenario:
    return Scenario(
        arch=ArchConfig("rnn", width=16, activation="tanh", cell="lstm"),
        data=DataConfig("sequence", n_features=8, n_classes=4, seq_len=12),
        train=TrainConfig(optimizer="adam", lr=severity, steps=100, batch_size=32),
        origin_scope="global",
        # the first large update saturates the head: measured at step 1 on seeds 0-2
        onset=OnsetRule("fixed", step=0, tolerance=3),
        manifestations=(Manifestation("saturated_share", module="act", direction="greater",
                          scale="linear", margin=0.3),),
    )


# --- train()/eval() mix-up -----------------------------------------------------------------

@register_family(
    name="left_in_eval_cnn_bn",
    kind="failure",
    architecture="CNN+BN",
    data="digits_image",
    description="A CNN with BatchNorm on raw digit intensities times 8 (0..128), which its "
                "BatchNorm layers would normalise; the user called model.eval() before the "
                "loop and never model.train(), so BatchNorm normalises with its initial "
                "running statistics (mean 0, variance 1), that is not at all: the gradients "
                "grow by orders of magnitude and the loss turns non-finite. The vocabulary "
                "has no cause for a mode mix-up: the label is an honest 'unknown'. "
                "Severity: the learning-rate multiplier of the buggy loop; 0 is the same loop "
                "in train mode.",
    default_severity=3.0,
    severities=(1.0, 3.0, 10.0),
    baseline_severity=0.0,
    failure_type="exploding_gradients",
    root_cause="unknown",
    code_fix="call model.train() before the training loop (and after every evaluation)",
    # inputs scaled down by hand do what the idle BatchNorm should have done
    equivalent_fixes=({"input_scale": 1 / 128},),
    counterfactuals=(
        {"knobs": {"lr_scale": 0.3}, "expected": "exploding_gradients"},
    ),
)
def _left_in_eval_cnn_bn(severity: float) -> Scenario:
    return Scenario(
        arch=ArchConfig("cnn", depth=2, width=8, activation="relu", normalization="batch"),
        data=DataConfig("digits_image", standardize=False, raw_scale=8.0),
        train=_lr_graded(TrainConfig(lr=0.05, momentum=0.9, steps=100), severity,
                         script="left_in_eval"),
        origin_scope="global",
        onset=OnsetRule("fixed", step=0, tolerance=100),
        manifestations=(_PLATEAU,),
    )


# --- a detached tensor starves layers of gradient ------------------------------------------

@register_family(
    name="detached_features_gru",
    kind="failure",
    architecture="GRU",
    data="sequence",
    description="A GRU classifier whose forward detaches the recurrent features before the "
                "head (`h = seq[:, -1].detach()`, left from a logging line): the GRU never "
                "gets a gradient and stays at its random init; only the small head learns, "
                "on features that do not carry the label, and the loss stalls. Severity: the "
                "learning-rate multiplier of the buggy model; 0 is the model without the "
                "detach.",
    default_severity=1.0,
    severities=(0.3, 1.0, 3.0),
    baseline_severity=0.0,
    failure_type="training_plateau",
    root_cause="gradient_blocked",
    code_fix="remove the .detach() from the forward pass",
    counterfactuals=(
        {"knobs": {"lr_scale": 3.0}, "expected": "training_plateau"},
    ),
)
def _detached_features_gru(severity: float) -> Scenario:
    return Scenario(
        arch=ArchConfig("rnn", width=16, activation="tanh", cell="gru",
                        detach_features=severity > 0),
        data=DataConfig("sequence", n_features=8, n_classes=4, seq_len=12, label_window="head"),
        train=_lr_graded(TrainConfig(optimizer="adam", lr=2e-2, steps=100, batch_size=32),
                         severity),
        origin_layers=("rnn",),
        origin_scope="layer",
        onset=OnsetRule("fixed", step=0, tolerance=100),
        manifestations=(_PLATEAU,),
    )
