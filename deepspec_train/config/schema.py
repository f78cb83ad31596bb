"""Typed schema of a training recipe.

A recipe YAML maps one-to-one onto these dataclasses; ``deepspec_train.config.loader`` validates the YAML and
command-line overrides against them (unknown keys and wrong types are errors). Defaults follow
DeepSpec's published settings (5 draft layers, block 7, Markov rank 256, 512 anchors, lr 6e-4 with 4% warmup, global
batch 512 sequences, 10 epochs) so that a production recipe only names what differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional, get_args


@dataclass
class RunConfig:
    name: str = "run"
    output_dir: str = "runs/run"
    seed: int = 0
    # The seed of the epoch order alone (null: run.seed). Drafter groups share one (jobs.drafter_groups): the seeds
    # of a comparison then differ in initialisation and anchors while every group trains on the same sequences.
    data_seed: Optional[int] = None
    # Start over in an output_dir that holds another run, after moving that run aside (never deleted).
    overwrite: bool = False


@dataclass
class TargetConfig:
    path: str = ""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    trust_remote_code: bool = False
    # 0-indexed decoder layers whose outputs are the drafter's context features (never the last layer); null:
    # the rule every family shares for the target's depth (config.target_tokens), logged and saved resolved.
    layer_ids: Optional[list[int]] = field(default_factory=lambda: [1, 9, 17, 25, 33])


# How rows are read (``data.row_shapes``): ``auto`` decides per source from its first rows; ``preformatted`` is
# ``text`` rows holding the target's own turn markers, and is never guessed.
RowFormatName = Literal[
    "auto", "chat", "prompt_completion", "prompt_response", "question_answer", "alpaca", "text", "preformatted"
]


@dataclass
class FieldNames:
    """The fields a row shape reads, when a data set names them otherwise (``data.fields``); unset keeps the
    shape's own name (e.g. ``data.fields={prompt: query, completion: reply}``)."""

    prompt: Optional[str] = None
    completion: Optional[str] = None
    response: Optional[str] = None
    question: Optional[str] = None
    answer: Optional[str] = None
    instruction: Optional[str] = None
    input: Optional[str] = None
    output: Optional[str] = None
    text: Optional[str] = None


@dataclass
class DataConfig:
    train: list[str] = field(default_factory=list)
    validation: list[str] = field(default_factory=list)
    max_length: int = 2048
    strict: bool = False
    cache_dir: str = "~/.cache/deepspec_train/shards"
    # A datasets split name when `train` / `validation` name a hub dataset or a dataset directory.
    split: str = "train"
    # Passed to the chat template (Qwen3: thinking off renders an empty <think></think> block, as in generation).
    enable_thinking: bool = False
    # Whether an assistant turn's reasoning trace (Qwen3's <think> block, GPT-OSS's analysis channel) is in the
    # loss: true trains the drafter on what a thinking target generates; false leaves the reasoning segment
    # (the trace and its delimiters, up to the answer's first token) as context only (``data.loss_mask``).
    supervise_reasoning: bool = True
    # Worker processes for tokenisation (0 = in-process).
    num_workers: int = 0
    # The row shape of every source (``docs/howto/data.md``), and the fields it reads where a data set renames them.
    format: RowFormatName = "auto"
    fields: FieldNames = field(default_factory=FieldNames)
    # A chat template for a target whose tokenizer has none (a base model): a built-in name ("chatml") or a Jinja
    # file; empty keeps the tokenizer's own. Chat-shaped rows need one; `text` rows never use it.
    chat_template: str = ""
    # A source of which a larger share of rows is skipped stops the run before the target loads: most often the
    # rows are read with the wrong shape or fields. Raise it (up to 1.0) to train on what is left.
    max_skipped_fraction: float = 0.5


# The enumerated values of the drafter settings, each defined once: the Literal is what the recipe loader checks,
# the tuple what the code iterates. Drafter kind names are the kind registry's keys (a test checks they agree).
DrafterKindName = Literal["dspark", "dflash", "eagle3", "dflash2"]
MarkovHeadType = Literal["vanilla", "gated", "rnn"]
MARKOV_HEAD_TYPES: tuple[str, ...] = get_args(MarkovHeadType)
# The plain low-rank bias: the default form, and the only one vLLM builds.
VANILLA_MARKOV_HEAD = MARKOV_HEAD_TYPES[0]
# "dspark": slot k predicts x_{a+k+1}; "zlab" (DFlash's own): slot j >= 1 predicts x_{a+j}.
LabelConvention = Literal["dspark", "zlab"]
LABEL_CONVENTIONS: tuple[str, ...] = get_args(LabelConvention)
DSPARK_LABELS, ZLAB_LABELS = LABEL_CONVENTIONS
# How a chunk's block groups are assigned to micro-batches (``packing.plans``: one record per name).
PackingOrderName = Literal["in_order", "first_fit"]
PACKING_ORDER_NAMES: tuple[str, ...] = get_args(PackingOrderName)


@dataclass
class DrafterConfig:
    kind: DrafterKindName = "dspark"
    num_layers: int = 5
    block_size: int = 7
    markov_rank: int = 256
    # The Markov head's form (DeepSpec / SGLang ``markov_head_type``): "vanilla" adds ``W2 W1[x_prev]``; "gated"
    # adds ``W2 (sigmoid(G [h_k ; W1[x_prev]] + b) * W1[x_prev])``; "rnn" carries a GRU-like state through the
    # block, ``s_k = g * s_{k-1} + (1 - g) * tanh(c)`` with ``[g; c; o] = J [s_{k-1} ; W1[x_prev] ; h_k] + b``, and
    # adds ``W2 tanh(o)``. vLLM serves only "vanilla"; SGLang serves all three.
    markov_head_type: MarkovHeadType = VANILLA_MARKOV_HEAD
    # Start of ``markov_w2``: "zero" (the bias starts at nothing, DFlash's behaviour at step 0) or "normal"
    # (normal(0, 0.02) like every other weight, DeepSpec's init).
    markov_init: Literal["zero", "normal"] = "zero"
    confidence_head: bool = True
    # Whether the confidence BCE trains the features it reads: "detached" (only the head's own weights learn) or
    # "joint" (its gradient also reaches the backbone and the Markov rows, as in DeepSpec).
    confidence_gradient: Literal["detached", "joint"] = "detached"
    # Which label convention the drafter is trained with: "dspark" (slot k predicts x_{a+k+1}) or "zlab"
    # (DFlash's own: slot j >= 1 predicts x_{a+j}; only for a DFlash exported in the z-lab layout).
    labels: LabelConvention = DSPARK_LABELS
    # null: the target's own, its family record's or else an unused special token of its tokenizer
    # (config.target_tokens), logged and saved resolved.
    mask_token_id: Optional[int] = 151669
    # None: take the target's MLP width.
    intermediate_size: Optional[int] = None
    # EAGLE-3 only.
    ttt_steps: int = 7
    ttt_decay: float = 0.8
    draft_vocab_size: Optional[int] = None
    # A drafter directory to start from instead of random weights (a published DSpark / z-lab DFlash / EAGLE-3
    # release, an export or a training output): its weights and heads are loaded, the optimizer starts fresh, and
    # its shapes and vocabulary must fit this recipe's drafter and target (``models.init_from``).
    init_from: Optional[str] = None
    # Target decoder layers to start the drafter's first decoder layers from (drafter layer i from target layer
    # ``[i]``; the rest as without it): tensors of the same name and shape are copied, the others keep their init
    # (``jobs.target_init``). None: random init.
    init_from_target_layers: Optional[list[int]] = None
    # Recompute activations in backward instead of keeping them (``models.activation_checkpointing``): each
    # DSpark / DFlash backbone layer, each EAGLE-3 TTT step and the context projection (``fc`` in row chunks) keep
    # only their inputs. Same losses and gradients, less memory at long context for one more forward (the long
    # context recipes turn it on; numbers in docs/reference/benchmarks.md). Not part of the run identity: a run may
    # resume with it switched.
    activation_checkpointing: bool = False
    # torch.compile each drafter block (backbone layer, EAGLE-3 decoder layer). None: on with CUDA, off on CPU.
    # Not part of the run identity: the same weights train either way.
    compile: Optional[bool] = None
    # DFlash2 only (0 elsewhere): taps and channels per group of the dynamic depthwise convolutions around each
    # attention and MLP sublayer (``models.dflash2_drafter``); the rank and the top-K candidates per slot of the
    # pairwise candidate selector; the weight of the selector's K-way CE in the loss (``models.dflash2_selector_loss``).
    conv_kernel_size: int = 0
    conv_group_size: int = 0
    selector_rank: int = 0
    selector_top_k: int = 0
    selector_loss_weight: float = 0.0


@dataclass
class AnchorConfig:
    # Anchors per sequence (all of its valid anchor positions when it has fewer). With ``per_1k_tokens`` set, the
    # floor: a sequence gets the larger of the two counts.
    num_per_sequence: int = 512
    # None, or anchors per 1,024 valid anchor positions (supervised tokens whose successor is supervised too): a
    # sequence with ``n`` of them gets ``max(min(num_per_sequence, n), round(per_1k_tokens * n / 1024))`` anchors,
    # at most ``n``. 128 keeps DeepSpec's 512-at-4,096 density for long sequences (``packing.anchors``).
    per_1k_tokens: Optional[float] = None
    # Context rows plus block tokens per packed micro-batch.
    token_budget: int = 16384
    # How a chunk's block groups fill micro-batches: "in_order" (greedy in input order, the historical plan) or
    # "first_fit" (first fit by decreasing cost, never more micro-batches than "in_order"; ``packing.plans``).
    packing: PackingOrderName = "in_order"


@dataclass
class LossConfig:
    alpha_ce: float = 0.1
    alpha_tv: float = 0.9
    alpha_conf: float = 1.0
    gamma_decay: float = 4.0
    temperature: float = 1.0
    # The distribution term: "tv" = 0.5 * sum |p_d - p_t| (= 1 - c*) or "l1" = sum |p_d - p_t| (DeepSpec's, twice
    # TV: the same alpha_tv then weighs it twice as much against CE).
    distance: Literal["tv", "l1"] = "tv"
    # What each step's loss is divided by: "token" = the supervised slots of the step (every slot weighs the same)
    # or "sequence" = for each slot, the summed position weights of its own sequence times the step's sequence
    # count (every sequence weighs the same; DeepSpec's rule, which it applies per micro-step of one sequence per
    # rank). Both are independent of micro-batching, accumulation and the number of drafter ranks.
    normalizer: Literal["token", "sequence"] = "token"
    # Supervised positions per chunk of the selected-logit loss.
    chunk_size: int = 1024


@dataclass
class TrainConfig:
    lr: float = 6e-4
    warmup_frac: float = 0.04
    weight_decay: float = 0.0
    # AdamW's first-moment decay.
    adam_beta1: float = 0.9
    # AdamW's second-moment decay.
    adam_beta2: float = 0.95
    # AdamW's denominator epsilon.
    adam_eps: float = 1e-8
    grad_clip: float = 1.0
    epochs: float = 10.0
    # When set, overrides `epochs`.
    max_steps: Optional[int] = None
    # Optimizer steps each target pass feeds (``training.feature_source.PassReplay``): the drafter keeps a pass's
    # micro-batches and trains on them this many times, so the target runs once per this many steps. 1: every
    # step runs the target (a run's step count, data order and anchors are per step then; with R, step ``s``
    # trains on what step ``s // R`` trains on without reuse).
    feature_reuse: int = 1
    # The most bytes of features one drafter rank may keep for reuse (one pass's micro-batches); a pass that
    # does not fit stops the run with one line.
    feature_reuse_bytes: int = 4 * 2**30
    # Sequences per optimizer step across all drafter ranks.
    global_batch_sequences: int = 512
    # Sequences per micro-batch on one drafter rank.
    micro_batch_sequences: int = 8
    eval_every: int = 500
    eval_sequences: int = 256
    checkpoint_every: int = 1000
    keep_last: int = 3
    resume: str = "none"
    # End this run after that step (checkpointed) without changing the LR schedule or data plan of the full
    # run: for time-boxed jobs that a later `train.resume=auto` continues.
    stop_at_step: Optional[int] = None
    mixed_precision: Literal["no", "bf16"] = "bf16"
    distributed: Literal["ddp", "deepspeed"] = "ddp"
    deepspeed_config: str = "launch/deepspeed/zero2.json"
    # A step whose loss or gradient norm is NaN or inf on any drafter rank is skipped by every rank; after this
    # many skipped in a row the run stops with one line (exit status 2), its last checkpoint kept.
    max_bad_steps: int = 10
    # Write a torch profiler trace of a few early steps per drafter rank to <output_dir>/profile/.
    profile: bool = False


@dataclass
class TopologyConfig:
    # 0 = colocated (each process runs the target itself); otherwise the first T ranks are target workers.
    target_workers: int = 0
    # Target ranks per tensor-parallel group: each group of target_tp ranks holds one replica of the target.
    target_tp: int = 1
    # What a group splits: "auto" = transformers' plan (attention heads, MLP and expert widths); "experts" = only
    # the MLP / expert widths, attention replicated on every rank (a MoE target with fewer key/value heads than
    # target_tp, e.g. Qwen3-235B-A22B's 4 heads at target_tp 8).
    target_tp_plan: Literal["auto", "experts"] = "auto"


@dataclass
class StreamConfig:
    # Micro-batches a target group's send queue may hold (one more is on the wire).
    depth: int = 2
    timeout_s: float = 300.0


@dataclass
class LoggingConfig:
    wandb: bool = True
    wandb_project: str = "deepspec_train"
    wandb_mode: Literal["offline", "online", "disabled"] = "offline"
    # W&B group the run joins (None: the target's directory name), so a drafter and its baselines for one
    # target sit side by side; runs are also tagged with the drafter kind, the target and the recipe (run.name).
    wandb_group: Optional[str] = None
    log_every: int = 10
    progress: bool = True


@dataclass
class RecipeConfig:
    run: RunConfig = field(default_factory=RunConfig)
    target: TargetConfig = field(default_factory=TargetConfig)
    data: DataConfig = field(default_factory=DataConfig)
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    anchors: AnchorConfig = field(default_factory=AnchorConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
