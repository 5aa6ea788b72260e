"""Training steps as users write them: the clean one, and the bugs people hit.

A scenario names its step in ``TrainConfig.script``. The runner owns everything around the
step (model, optimizer, batches, the knobs, ``dbg.step``), so every family answers every knob
the same way; the step is the user's loop body, written here as a user would write it, bug
included. ``setup`` runs once on the model before training (where a user calls
``model.train()`` or, by mistake, leaves it in ``eval()``).

The bugs follow the published taxonomies of real deep-learning faults (Humbatova et al.,
ICSE 2020: "missing zero_grad", "wrong mode train/eval"; Islam et al., FSE 2019; Zhang et
al., ISSTA 2018) and what people ask about on the PyTorch forums.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["TrainingScript", "register_script", "get_script", "SCRIPTS"]

#: ``step(model, opt, loss_fn, x, y, clip, t, period) -> loss``: ``clip()`` applies the run's
#: clipping, ``t`` is the step index and ``period`` the scenario's ``TrainConfig.script_period``.
Step = Callable[..., torch.Tensor]


@dataclass(frozen=True, slots=True)
class TrainingScript:
    """One training step as a user wrote it.

    Attributes
    ----------
    name : str
    step : callable
        ``step(model, opt, loss_fn, x, y, clip, t, period) -> loss`` (the loss tensor of
        the step).
    setup : callable or None
        ``setup(model)`` once before the first step.
    description : str
        The bug, in a line (empty for the clean step).
    """

    name: str
    step: Step
    setup: Callable[[nn.Module], None] | None = None
    description: str = ""


SCRIPTS: dict[str, TrainingScript] = {}


def register_script(name: str, *, setup: Callable[[nn.Module], None] | None = None,
                    description: str = "") -> Callable[[Step], Step]:
    """Register a training step under ``name`` (duplicates are rejected)."""

    def decorator(step: Step) -> Step:
        if name in SCRIPTS:
            raise ValueError(f"A training script named {name!r} is already registered; "
                             f"registered scripts are: {sorted(SCRIPTS)}")
        SCRIPTS[name] = TrainingScript(name, step, setup, description)
        return step

    return decorator


def get_script(name: str) -> TrainingScript:
    """The script registered as ``name``.

    Raises
    ------
    ValueError
        Listing the registered scripts.
    """
    try:
        return SCRIPTS[name]
    except KeyError:
        raise ValueError(f"Unknown training script {name!r}. Registered scripts are: "
                         f"{sorted(SCRIPTS)}") from None


@register_script("standard")
def _standard(model, opt, loss_fn, x, y, clip, t, period):  # noqa: ANN001, ANN202, ARG001
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    clip()
    opt.step()
    return loss


@register_script("zero_grad_per_epoch", description="opt.zero_grad() once per epoch of "
                 "`period` batches instead of once per batch: every backward in between adds "
                 "to the gradients of the steps before (period 1 is the correct loop)")
def _zero_grad_per_epoch(model, opt, loss_fn, x, y, clip, t, period):  # noqa: ANN001, ANN202
    if t % period == 0:  # the user meant "once per batch" and wrote it at the epoch loop
        opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    clip()
    opt.step()
    return loss


def _left_in_eval(model: nn.Module) -> None:
    # the user evaluated the model before training ("sanity check") and never called
    # model.train(): BatchNorm uses its initial running statistics, dropout is off
    model.eval()


# the loop itself is the standard one: the bug is the missing model.train() before it
register_script("left_in_eval", setup=_left_in_eval,
                description="model.eval() before the loop and no model.train(): BatchNorm "
                "normalises with its initial running statistics (mean 0, variance 1)")(_standard)
