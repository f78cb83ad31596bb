"""The Markov head's forms (``drafter.markov_head_type``): one record per form, looked up by name.

The forms are DeepSpec's / SGLang's ``vanilla``, ``gated`` and ``rnn`` heads (``MarkovHead`` in
``models.parallel_drafter`` writes out their formulas). What differs between them is held here and nowhere else:
the one projection a form adds to the two low-rank factors (its parameter name and shape, which the drafter
builds, the export layout lists and the serving-cost model reads), whether a recurrent state runs through a
block's slots (and its initial value), the step from a slot's inputs to its latent, and the engines that serve
the form. Other modules ask the record; none tests a form's name (``tests/test_architecture.py`` checks).

No torch at import (the layout records and the serving-cost model read the shapes without it): the steps import
it when they run, by which time the drafter has loaded it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from deepspec_train.config.schema import VANILLA_MARKOV_HEAD

# The serving engines (``serving_layouts.engine_reading.ENGINES``; a test ties the two).
VLLM, SGLANG = "vllm", "sglang"


@dataclass(frozen=True)
class MarkovProjection:
    """The linear layer a form adds, ``markov_head.{name}``: weight ``[out_factor * r, d + token_factor * r]`` and a
    bias ``[out_factor * r]``. Its input is the slot state ``h`` (``d`` columns, first when ``hidden_first``, else
    last) next to the part that depends on the sampled tokens (``token_factor * r`` columns)."""

    name: str
    out_factor: int
    token_factor: int
    hidden_first: bool

    def out_width(self, rank: int) -> int:
        return self.out_factor * rank

    def token_width(self, rank: int) -> int:
        return self.token_factor * rank

    def weight_shape(self, rank: int, hidden_size: int) -> tuple[int, int]:
        return self.out_width(rank), hidden_size + self.token_width(rank)

    def hidden_columns(self, rank: int, hidden_size: int) -> slice:
        """The weight's columns that read the slot state."""
        return slice(0, hidden_size) if self.hidden_first else slice(self.token_width(rank), None)

    def token_columns(self, rank: int, hidden_size: int) -> slice:
        """The weight's columns that read the token-dependent part."""
        return slice(hidden_size, None) if self.hidden_first else slice(0, self.token_width(rank))


# A step: (the head module, ``e = W1[x_prev] [..., r]``, the slot's hidden projection, the state) -> (latent, state).
Step = Callable[[Any, Any, Any, Any], tuple[Any, Any]]


@dataclass(frozen=True)
class MarkovForm:
    """One form of the Markov head. ``recurrent``: a state ``[..., r]`` starts at zeros before a block's first slot
    and runs left to right through its slots; ``engines``: the serving engines that build this form."""

    name: str
    projection: Optional[MarkovProjection]
    recurrent: bool
    step: Step
    engines: tuple[str, ...]

    @property
    def reads_slot_states(self) -> bool:
        """Whether a latent reads the slot states (then the projection's slot-state part is computed per block)."""
        return self.projection is not None

    def parameter_shapes(self, rank: int, hidden_size: int) -> dict[str, tuple[int, ...]]:
        """The form's own tensors under ``markov_head.``, beyond the two factors, in the order the head holds them."""
        if self.projection is None:
            return {}
        out = self.projection.out_width(rank)
        name = self.projection.name
        return {f"{name}.weight": self.projection.weight_shape(rank, hidden_size), f"{name}.bias": (out,)}

    def initial_state(self, like: Any, rank: int) -> Any:
        """The state before a block's first slot (``[*like.shape[:-1], r]`` zeros; None without one)."""
        return like.new_zeros(*like.shape[:-1], rank) if self.recurrent else None


def _vanilla_step(head: Any, embed: Any, hidden_projection: Any, state: Any) -> tuple[Any, Any]:
    return embed, state


def _gated_step(head: Any, embed: Any, hidden_projection: Any, state: Any) -> tuple[Any, Any]:
    import torch
    import torch.nn.functional as F

    weight = head.gate_proj.weight
    columns = GATED.projection.token_columns(head.rank, weight.shape[1] - head.rank)
    gate = torch.sigmoid(hidden_projection + F.linear(embed, weight[:, columns]))
    return gate * embed, state


def _rnn_step(head: Any, embed: Any, hidden_projection: Any, state: Any) -> tuple[Any, Any]:
    import torch

    r = head.rank
    weight = head.joint_proj.weight
    inputs = torch.cat([state, embed], dim=-1)
    token_weight = weight[:, RNN.projection.token_columns(r, weight.shape[1] - 2 * r)]
    z = torch.addmm(hidden_projection.reshape(-1, 3 * r), inputs.reshape(-1, 2 * r), token_weight.T)
    z = z.view(*inputs.shape[:-1], 3 * r)
    gate = torch.sigmoid(z[..., :r])
    candidate, output = torch.tanh(z[..., r:]).split(r, dim=-1)
    # g * s + (1 - g) * tanh(c), as one interpolation.
    return output, torch.lerp(candidate, state, gate)


VANILLA = MarkovForm("vanilla", None, recurrent=False, step=_vanilla_step, engines=(VLLM, SGLANG))
# u = sigmoid(gate_proj([h ; e])) * e.
GATED = MarkovForm(
    "gated", MarkovProjection("gate_proj", out_factor=1, token_factor=1, hidden_first=True), recurrent=False,
    step=_gated_step, engines=(SGLANG,),
)
# [g; c; o] = joint_proj([s ; e ; h]), s' = sigmoid(g) * s + (1 - sigmoid(g)) * tanh(c), u = tanh(o).
RNN = MarkovForm(
    "rnn", MarkovProjection("joint_proj", out_factor=3, token_factor=2, hidden_first=False), recurrent=True,
    step=_rnn_step, engines=(SGLANG,),
)

MARKOV_FORMS: dict[str, MarkovForm] = {form.name: form for form in (VANILLA, GATED, RNN)}
# The form a recipe gets by default, and the one an export without a Markov head (a DSpark-label DFlash) names.
DEFAULT_FORM = MARKOV_FORMS[VANILLA_MARKOV_HEAD]


def find_form(name: Any) -> Optional[MarkovForm]:
    """The form called ``name`` (None for anything else, a value read from a config file included)."""
    return MARKOV_FORMS.get(name) if isinstance(name, str) else None


def markov_form(name: str) -> MarkovForm:
    """The form called ``name``; a one-line error naming the forms otherwise."""
    form = find_form(name)
    if form is None:
        raise ValueError(f"markov_head_type must be one of {tuple(MARKOV_FORMS)}, got {name!r}")
    return form


def forms_served_by(engine: str) -> tuple[str, ...]:
    """The names of the forms ``engine`` builds, in the records' order."""
    return tuple(name for name, form in MARKOV_FORMS.items() if engine in form.engines)


def served_by(engine: str, name: Any) -> bool:
    """Whether ``engine`` builds the form called ``name`` (False for a name that is no form)."""
    form = find_form(name)
    return form is not None and engine in form.engines
