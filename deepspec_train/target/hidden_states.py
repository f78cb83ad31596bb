"""Run the target forward and collect what the drafter needs: the outputs of the tapped decoder layers
(context features) and the final-norm output (the pre-LM-head state).

Forward hooks are used instead of ``output_hidden_states`` because, with transformers 5.x, the last entry of
``hidden_states`` already has the final norm applied and the indexing convention differs between versions;
hooks on ``layers[k]`` and ``norm`` mean exactly "output of decoder layer k" and "what lm_head consumes".
The LM head itself is never run here: full-vocabulary logits are not needed on the target side.

The caller says whether a batch is padded (a padding mask, or None), so the decoder layers' attention mask is
built without reading a device value (``target.layer_masks``): the forward adds no host sync to a training step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from deepspec_train.common.errors import UserError
from deepspec_train.target.layer_masks import builds_layer_masks, layer_mask


@dataclass
class TargetStates:
    ctx_features: torch.Tensor  # [batch, seq, K * d]: tapped layer outputs, concatenated in layer-id order
    final_hidden: torch.Tensor  # [batch, seq, d]: final-norm output


class UnsupportedTarget(UserError, ValueError):
    """A target whose decoder transformers does not expose the way the taps need (one-line message)."""


def decoder_of(model: PreTrainedModel) -> torch.nn.Module:
    """The decoder stack (``model.model`` for every causal LM of the Llama lineage: Qwen, Llama, Gemma, GPT-OSS,
    DeepSeek, Mistral, Phi-3, OLMo-2 ...); a one-line ``UnsupportedTarget`` naming what is missing otherwise."""
    base = getattr(model, "model", None)
    missing = ["model"] if base is None else [f"model.{name}" for name in ("layers", "norm") if not hasattr(base, name)]
    if missing:
        raise UnsupportedTarget(
            f"{type(model).__name__}: no {', '.join(missing)}: the drafter's taps need transformers' decoder-layer "
            "list at model.layers and the final norm at model.norm (what lm_head consumes)")
    return base


class TargetTap:
    """Hooks on the tapped layers and on the final norm of a causal LM."""

    def __init__(self, model: PreTrainedModel, layer_ids: list[int]):
        self.model = model
        self.decoder = decoder_of(model)
        num_layers = len(self.decoder.layers)
        for layer_id in layer_ids:
            if not 0 <= layer_id < num_layers - 1:
                raise ValueError(
                    f"target layer id {layer_id} out of range: the target has {num_layers} decoder layers and the "
                    f"context must come from layers 0..{num_layers - 2} (never the last)"
                )
        self.layer_ids = list(layer_ids)
        self.builds_masks = builds_layer_masks(self.decoder.config)

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> TargetStates:
        """The states of a forward over ``input_ids`` (``[batch, seq]``); ``attention_mask``: the 2D padding mask of a
        padded batch, None for a batch without padding (an all-ones mask gives the same features, through a
        materialised causal mask where None lets ``sdpa`` run ``is_causal``)."""
        captured: dict[str, torch.Tensor] = {}

        def keep(name: str):
            def hook(_module, _inputs, output):
                captured[name] = output[0] if isinstance(output, tuple) else output

            return hook

        layer_pre_hooks = []
        if self.builds_masks:
            mask = layer_mask(self.decoder.config, input_ids, self.decoder.get_input_embeddings().weight.dtype,
                              attention_mask)
            layer_pre_hooks = [_with_mask(mask)] * len(self.decoder.layers)
            # A 4D mask is returned as it is by transformers' mask building, which then reads nothing; every layer
            # gets ``mask`` instead from its pre-hook.
            attention_mask = _PLACEHOLDER_MASK
        handles = [self.decoder.layers[i].register_forward_hook(keep(f"layer{i}")) for i in self.layer_ids]
        handles.append(self.decoder.norm.register_forward_hook(keep("norm")))
        handles += [layer.register_forward_pre_hook(hook, with_kwargs=True)
                    for layer, hook in zip(self.decoder.layers, layer_pre_hooks)]
        try:
            self.decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        finally:
            for handle in handles:
                handle.remove()
        ctx = torch.cat([captured[f"layer{i}"] for i in self.layer_ids], dim=-1)
        return TargetStates(ctx_features=ctx, final_hidden=captured["norm"])


# Never reaches attention: a layer's pre-hook replaces it, and refuses to run a layer called without it.
_PLACEHOLDER_MASK = torch.empty(0, 0, 0, 0, dtype=torch.bool)


def _with_mask(mask: torch.Tensor | None):
    def pre_hook(module, args, kwargs):
        if kwargs.get("attention_mask") is not _PLACEHOLDER_MASK:
            raise RuntimeError(f"{type(module).__name__} was called without the attention mask keyword the tap "
                               "replaces; this target needs transformers' own mask building")
        return args, kwargs | {"attention_mask": mask}

    return pre_hook
