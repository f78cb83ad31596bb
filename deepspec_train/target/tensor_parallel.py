"""Load one tensor-parallel replica of the target over the ranks of a target group, with transformers' own TP plan.

Every rank of the group calls ``load_target_tensor_parallel`` with the group's process group: transformers
shards the weights as the model's TP plan says (attention heads and MLP / expert widths split column-wise, the
output projections row-wise with an all-reduce, the embedding and LM head by vocabulary, norms and the router
replicated), each rank reads only its shards, and a forward on identical inputs is collective over the group and
returns the full hidden states on every rank, so the decoder-layer hooks of ``target.hidden_states`` tap them
unchanged. With ``topology.target_tp_plan = "experts"`` the attention rules are overridden with transformers'
``replicate`` style: every rank holds and runs the whole attention and only the MLP / expert widths are split,
for mixture-of-experts targets whose key/value heads do not divide the group (their experts hold nearly all
the weights).

Why a mesh of our own: transformers 5.x builds its device mesh over the whole default process group and asks the
world size to equal the tensor-parallel size, while a streamed world also holds the drafter ranks and the other
target groups. The model class's ``prepare_distribute_model`` is where transformers sets its mesh up; a subclass
overriding it hands transformers a one-dimensional mesh over the group instead (every parallel dimension it asks
for is that mesh: pipeline, data and expert parallelism are 1 here). Everything else, the plan, the sharded
loading and the forward's collectives, is transformers'. Collectives run over gloo on CPU and NCCL on GPU
(the group's backend).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from transformers import PreTrainedModel

from deepspec_train.config.schema import TargetConfig
from deepspec_train.target.loading import load_target_config, resolve_dtype


class _GroupMesh:
    """transformers' mesh-manager interface (``get_mesh``) answered with one tensor-parallel mesh."""

    def __init__(self, mesh: Any):
        self.mesh = mesh

    def get_mesh(self, dims: Any) -> Any:
        return self.mesh


def _causal_lm_class(config: Any) -> type:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:
        raise ValueError(
            f"topology.target_tp > 1 needs a transformers-native causal LM; {type(config).__name__} has none "
            "(remote-code targets run with target_tp = 1)"
        ) from None


def _plan_override(config: Any, plan: str) -> Any:
    """``"auto"`` or the TP-plan override that replicates every attention rule of the model's plan."""
    if plan == "auto":
        return "auto"
    return {f"model.{key}": "replicate" for key in config.base_model_tp_plan if ".self_attn." in key}


def load_target_tensor_parallel(
    cfg: TargetConfig, device: torch.device, group: dist.ProcessGroup, plan: str = "auto"
) -> PreTrainedModel:
    """This rank's shard of the target, in eval mode with gradients off (collective over ``group``); ``plan`` is
    ``topology.target_tp_plan``."""
    from torch.distributed.device_mesh import DeviceMesh
    from transformers.distributed.configuration_utils import DistributedConfig

    config = load_target_config(cfg)
    base = _causal_lm_class(config)
    mesh = _GroupMesh(DeviceMesh.from_group(group, device.type, mesh_dim_names=("tp",)))

    def prepare_distribute_model(cls, distributed_config, device_map=None):
        return distributed_config, device, mesh

    group_class = type(base.__name__, (base,), {"prepare_distribute_model": classmethod(prepare_distribute_model)})
    size = dist.get_world_size(group)
    model = group_class.from_pretrained(
        cfg.path, config=config, dtype=resolve_dtype(cfg.dtype, device),
        distributed_config=DistributedConfig(tp_plan=_plan_override(config, plan), tp_size=size),
    )
    model.eval()
    model.requires_grad_(False)
    return model
