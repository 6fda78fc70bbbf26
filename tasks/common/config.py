"""Typed configuration: one dataclass per stage, the schema of params.yaml.

omegaconf's structured configs reject unknown keys and values of the wrong type;
the field metadata here adds ranges and choices, which ``tasks/common/params.py`` checks when
it loads params.yaml. Each field's ``help`` documents it and feeds the CLI's ``--help``
and the Prefect parameter form.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

PROBLEM_NAMES = ("arithmetic", "countdown")
LR_SCHEDULES = ("constant", "cosine")
DEVICES = ("auto", "cpu", "cuda")


# Why an upper bound: past it a stage would run for hours here; a user who means it can raise the bound.
_HOURS = "a larger value takes hours to generate, validate and train on"
SEED_MAX = 2**32 - 1  # numpy's seeding takes 32 bits


class ConfigError(ValueError):
    """A configuration that fails validation; the message names the offending key."""


def param(default: Any, help: str, **checks: Any) -> Any:
    """A documented field. ``checks``: gt, ge, lt, le (numbers; ``why`` says what a larger value would cost),
    choices, chars (allowed characters), or
    registered: the name of a registry in ``tasks/rl/core_algos.py``, ``preference_losses.py`` or
    ``distill_losses.py`` whose keys are the choices (plus ``extra_choices``), so a new estimator or loss is one
    registered function and no edit here."""
    return field(default=default, metadata={"help": help, **checks})


def section(cls: type, help: str, *stages: StageKind) -> Any:
    """A section of params.yaml; ``stages`` are the stage kinds that run with it (none for shared settings)."""
    return field(default_factory=cls, metadata={"help": help, "stages": stages})


@dataclass(frozen=True)
class StageKind:
    """A kind of pipeline stage, declared once beside the params section it runs with.

    The CLI's help and stage lookup, params validation (which names are models), the Prefect
    flows and the DAG tests read this; ``dvc.yaml`` declares the same stage's files, and a test
    keeps the two in step.
    """

    name: str  # the stage's name in dvc.yaml (before any @)
    entry: str  # "module:function" that runs it: function(params) or, with a target, function(params, target)
    description: str  # one line, for `alignflow --help`
    writes: str  # what it leaves under artifacts/<stage>: "model", "reward models", "dataset" or "evaluation"
    # The artifacts it reads, as dvc.yaml names them: a stage ("data"), a section's model param ("${init}"),
    # or its target ("${model}", "rejection@${round}", "${round.policy}").
    reads: tuple[str, ...] = ()
    target: str | None = None  # what follows @ in the stage's name: "round" or "model"


@dataclass
class ArithmeticConfig:
    digits: int = param(3, "Digits per operand (the multiplier of '*' is one digit).", ge=1, le=12)
    ops: str = param("+-*", "Operations to draw from, any of '+', '-', '*'.", chars="+-*")


@dataclass
class CountdownConfig:
    count: int = param(3, "Numbers given per puzzle; each must be used exactly once.", ge=2, le=6)
    max_number: int = param(40, "Numbers are drawn from 1..max_number.", ge=2)
    max_target: int = param(100, "Upper bound on intermediate products, which bounds the target.", ge=10)
    ops: str = param("+-", "Operations solutions use, any of '+', '-', '*', '/'; must include '+'.", chars="+-*/")


@dataclass
class TaskConfig:
    name: str = param("countdown", "Problem family to train and evaluate on.", choices=PROBLEM_NAMES)
    arithmetic: ArithmeticConfig = section(ArithmeticConfig, "Settings of the arithmetic family.")
    countdown: CountdownConfig = section(CountdownConfig, "Settings of the countdown family.")


@dataclass
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


@dataclass
class ModelSizeConfig:
    """The size of a tiny built-in Llama (the base model's, or the reward backbone's)."""

    hidden_size: int = param(96, "Tiny model: width of the residual stream.", ge=8)
    num_layers: int = param(3, "Tiny model: transformer blocks.", ge=1)
    num_heads: int = param(4, "Tiny model: attention heads (must divide hidden_size).", ge=1)
    intermediate_size: int = param(384, "Tiny model: width of the MLP.", ge=8)
    max_position_embeddings: int = param(128, "Tiny model: longest sequence it can attend over.", ge=16)


@dataclass
class BaseConfig(ModelSizeConfig):
    model_path: str | None = param(
        None, "A Hugging Face model directory to start from; null builds the tiny built-in model."
    )


@dataclass
class OptimizationConfig:
    """A fixed number of AdamW steps over a dataset, resumable (``tasks/common/training.py:fit``): SFT and DPO."""

    lr: float = param(2e-3, "Peak AdamW learning rate.", gt=0)
    weight_decay: float = param(0.01, "AdamW decoupled weight decay.", ge=0)
    warmup_steps: int = param(50, "Linear warm-up steps before cosine decay.", ge=0)
    max_steps: int = param(600, "Optimizer steps.", ge=1)
    batch_size: int = param(64, "Sequences per optimizer step.", ge=1)
    grad_clip: float = param(1.0, "Clip the global gradient norm to this value.", gt=0)
    save_every: int = param(100, "Write a resumable checkpoint every N steps.", ge=1)
    log_every: int = param(20, "Log training metrics every N steps.", ge=1)


@dataclass
class ParallelConfig:
    """How many processes train a stage's model, and how: Ray workers in a placement group, joined by
    torch.distributed (gloo on CPU, NCCL on GPU). Every worker takes an equal slice of every batch, so the global
    batch, the optimiser steps and (to float rounding) the loss curve are the one-worker run's."""

    num_workers: int = param(1, "Data-parallel workers; 1 trains in the stage's own process.", ge=1)
    strategy: str = param(
        "ddp",
        "ddp: a full replica per worker, gradients averaged; fsdp: parameters, gradients and optimiser state "
        "sharded across the workers (FSDP2 fully_shard), for a model one device cannot hold.",
        choices=("ddp", "fsdp"),
    )
    cpus_per_worker: float = param(1.0, "CPUs Ray reserves per worker.", ge=0)
    gpus_per_worker: float = param(0.0, "GPUs Ray reserves per worker (with device: cuda).", ge=0)
    memory_gb_per_worker: float = param(0.0, "Memory Ray reserves per worker, in GiB (0: no reservation).", ge=0)
    threads_per_worker: int = param(
        1, "torch threads per worker (Ray would give each one); with the world size, they fix the bits.", ge=1
    )
    placement: str = param(
        "PACK",
        "Ray placement group strategy: PACK (as few nodes as fit), SPREAD, STRICT_SPREAD (one worker per node), "
        "STRICT_PACK (one node).",
        choices=("PACK", "SPREAD", "STRICT_SPREAD", "STRICT_PACK"),
    )
    resources_per_worker: dict[str, float] = field(
        default_factory=dict,
        metadata={"help": "Custom Ray resources each worker needs, e.g. {gpu_node: 1} to pin workers to nodes."},
    )


@dataclass
class SFTTrainingConfig(OptimizationConfig):
    """How a model is fine-tuned on worked solutions (every SFT stage, and the reward backbone)."""

    max_prompt_length: int = param(32, "Longest prompt in tokens; a longer one is an error.", ge=1)
    max_length: int = param(96, "Longest prompt + response in tokens; a longer example is an error.", ge=2)
    num_examples: int | None = param(None, "Train on the first N examples only; null: all of them.", ge=1)
    parallel: ParallelConfig = section(ParallelConfig, "Data-parallel workers: how many, how sharded, where.")


@dataclass
class SFTConfig(SFTTrainingConfig):
    init: str = param("base", "The model to start from: base, or a stage that trains one (sft_cold, grpo, ...).")


@dataclass
class RewardBackboneConfig(SFTTrainingConfig, ModelSizeConfig):
    """A backbone of its own for the reward model (``reward_model.backbone: reward_backbone``): a tiny Llama of
    this size, built from the seed and fine-tuned on the task's worked solutions, as sft is. A reward model
    may be larger than the policy it judges (InstructGPT's one 6B reward model served policies of several
    sizes); checking an answer is at least as hard as producing it."""

    hidden_size: int = param(192, "Tiny model: width of the residual stream.", ge=8)
    num_layers: int = param(6, "Tiny model: transformer blocks.", ge=1)
    num_heads: int = param(6, "Tiny model: attention heads (must divide hidden_size).", ge=1)
    intermediate_size: int = param(768, "Tiny model: width of the MLP.", ge=8)


@dataclass
class StudentBaseConfig(BaseConfig):
    """The distillation student before training: a tiny Llama of this size built from the seed with the teacher's
    tokenizer, or a model of your own (``model_path``) whose tokenizer must be the teacher's. The default has
    0.29 of the default teacher's parameters (130 k against 453 k): as deep as the teacher, narrower. Measured at
    about 0.3 of the teacher (README): two blocks of width 64 reached greedy pass@1 0.775 after SFT on the teacher's
    data, three blocks of width 56 or 64, or four of 48, 0.84-0.855 (the teacher: 0.835); the sums in a worked
    solution want depth."""

    hidden_size: int = param(64, "Tiny model: width of the residual stream.", ge=8)
    num_layers: int = param(3, "Tiny model: transformer blocks.", ge=1)
    num_heads: int = param(2, "Tiny model: attention heads (must divide hidden_size).", ge=1)
    intermediate_size: int = param(128, "Tiny model: width of the MLP.", ge=8)
    model_path: str | None = param(
        None,
        "A Hugging Face model directory to start the student from; its tokenizer must be the teacher's (the same "
        "vocabulary and ids: distillation compares the two models token by token). null builds the tiny model.",
    )


def _student_sft_defaults() -> SFTConfig:
    return SFTConfig(init="student_base")


def _cold_start_defaults() -> SFTConfig:
    return SFTConfig(max_steps=500, warmup_steps=20, num_examples=2000, save_every=50)


def _sft_rs_defaults() -> SFTConfig:
    return SFTConfig(max_steps=600)


@dataclass
class EvalConfig:
    k: int = param(8, "Samples per prompt for pass@k.", ge=1)
    temperature: float = param(1.0, "Sampling temperature for pass@k.", gt=0)
    max_new_tokens: int = param(64, "Longest response generated.", ge=1)
    batch_size: int = param(256, "Prompts per generation batch.", ge=1)


@dataclass
class StageResources:
    num_cpus: float = param(1.0, "CPUs Ray reserves for the stage.", ge=0)
    num_gpus: float = param(0.0, "GPUs Ray reserves for the stage (train on them with device: cuda).", ge=0)
    memory_gb: float = param(0.0, "Memory Ray reserves for the stage, in GiB (0: no reservation).", ge=0)


@dataclass
class JudgeConfig:
    """The hidden gold judge: a task-defined utility in [0, 1] (correctness first, then format, then concision)."""

    label_noise: float = param(
        0.55,
        "Bradley-Terry noise of preference labels: P(a preferred) = sigmoid((u_a - u_b) / label_noise); "
        "0 gives noise-free labels. The default makes training labels agree with the judge about 75% of the time.",
        ge=0,
    )


@dataclass
class PreferencesConfig:
    policy: str = param(
        "sft_cold",
        "The model whose responses are sampled and judged: PPO's start (ppo.init), so the reward model learns to "
        "rank the responses PPO will produce first, as InstructGPT's comparisons came from its SFT policy.",
    )
    num_prompts: int = param(4000, "Training prompts to sample responses for (from the training split).", ge=1)
    samples_per_prompt: int = param(4, "Responses sampled per prompt (K); every pair of them is labelled.", ge=2)
    temperature: float = param(1.0, "Sampling temperature of the SFT policy.", gt=0)
    max_new_tokens: int = param(64, "Longest sampled response.", ge=1)
    judge: JudgeConfig = section(JudgeConfig, "The gold judge that labels pairs.")
    train_file: str | None = param(None, "Preference JSONL of your own to train the reward model on.")
    test_file: str | None = param(None, "Preference JSONL of your own to evaluate the reward model on.")


@dataclass
class RewardModelConfig:
    # 3e-4 for 4 epochs beat 1e-3 for 2 on the policy-sized backbone: held-out accuracy 0.676 against 0.591
    lr: float = param(3e-4, "Peak AdamW learning rate.", gt=0)
    weight_decay: float = param(0.01, "AdamW decoupled weight decay.", ge=0)
    warmup_steps: int = param(20, "Linear warm-up steps before cosine decay.", ge=0)
    epochs: int = param(4, "Passes over the preference pairs.", ge=1)
    batch_size: int = param(32, "Pairs per optimizer step.", ge=1)
    grad_clip: float = param(1.0, "Clip the global gradient norm to this value.", gt=0)
    ensemble_size: int = param(1, "Reward models trained from different seeds; PPO combines them.", ge=1)
    backbone: str = param(
        "reward_backbone",
        "The model the reward model is fine-tuned from (a model trained before it): it need not be the policy's, "
        "as InstructGPT's one 6B reward model served policies of several sizes.",
    )
    save_every: int = param(50, "Write a resumable checkpoint every N steps.", ge=1)
    log_every: int = param(20, "Log training metrics every N steps.", ge=1)
    parallel: ParallelConfig = section(ParallelConfig, "Data-parallel workers of each member's training.")


@dataclass
class BestOfNConfig:
    """Best-of-n with the reward model: the cheapest check that it ranks well, before any RL."""

    policy: str = param(
        "sft_cold", "The model whose samples the reward model picks among (PPO's start, ppo.init, by default)."
    )
    n: int = param(8, "Samples per held-out prompt; the reward model's favourite is kept.", ge=2, le=1024)


@dataclass
class PreferenceLossConfig:
    """A preference loss and its knobs (``tasks/rl/preference_losses.py``): the dpo stage's and online_dpo's."""

    preference_loss: str = param(
        "dpo",
        "Preference loss registered in tasks/rl/preference_losses.py: dpo, cdpo, ipo, hinge (SLiC), simpo and "
        "orpo (the last two without a reference).",
        registered="PREFERENCE_LOSSES",
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
        "Weight of an SFT term on the chosen response (RPO): it keeps the chosen log-prob from falling.",
        ge=0,
    )


@dataclass
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
    # Measured on the default task (held-out gold reward from sft_cold's 0.566): dpo alone for 300 steps at 1e-4
    # lost 0.041, with sft_weight 1 it gained 0.018; 1500 steps at 2e-4 with sft_weight 2 gained 0.059 (README).
    lr: float = param(2e-4, "Peak AdamW learning rate.", gt=0)
    warmup_steps: int = param(20, "Linear warm-up steps before cosine decay.", ge=0)
    max_steps: int = param(1500, "Optimizer steps.", ge=1)
    batch_size: int = param(64, "Preference pairs per optimizer step.", ge=1)
    sft_weight: float = param(
        2.0,
        "Weight of an SFT term on the chosen response (RPO): it keeps the chosen log-prob from falling, and on "
        "these noisy labels it is most of what offline DPO gains.",
        ge=0,
    )
    parallel: ParallelConfig = section(ParallelConfig, "Data-parallel workers: how many, how sharded, where.")


def _default_roles() -> dict[str, StageResources]:
    return {role: StageResources(num_cpus=0.5) for role in ("actor", "critic", "reference", "reward", "rollout")}


@dataclass
class RLConfig:
    """One RL stage: PPO, GRPO and their kin share this schema and one trainer (``tasks/rl/trainer.py``).

    An iteration samples ``group_size`` responses for each of ``rollout_batch_size`` prompts, scores
    them with ``rewards``, turns the scores into advantages with the ``advantage`` estimator and
    takes ``epochs`` passes of ``policy_loss`` over them. Which math runs is chosen by name here;
    the trainer never branches on an algorithm's name.
    """

    steps: int = param(150, "Iterations (roll out, score, update).", ge=1)
    rollout_batch_size: int = param(128, "Prompts rolled out per iteration.", ge=1)
    group_size: int = param(1, "Responses sampled per prompt (G); group advantages compare them.", ge=1)
    minibatch_size: int = param(64, "Responses per gradient step.", ge=1)
    epochs: int = param(2, "Passes over each rollout batch; epochs x minibatches = updates per batch (mu).", ge=1)
    actor_lr: float = param(1e-4, "Policy AdamW peak learning rate.", gt=0)
    critic_lr: float = param(5e-4, "Critic AdamW peak learning rate (estimators with a critic only).", gt=0)
    warmup_steps: int = param(5, "Linear learning-rate warm-up, in iterations.", ge=0)
    lr_schedule: str = param(
        "constant", "After warm-up: constant, or cosine decay to 0 at the last iteration.", choices=LR_SCHEDULES
    )
    temperature: float = param(1.0, "Rollout sampling temperature.", gt=0)
    max_new_tokens: int = param(64, "Longest rollout response.", ge=1)
    advantage: str = param(
        "gae",
        "Advantage estimator registered in tasks/rl/core_algos.py: gae (with a critic), grpo, dr_grpo, rloo, ...",
        registered="ADVANTAGE_ESTIMATORS",
    )
    gamma: float = param(1.0, "Discount (gae, reinforce_pp).", ge=0, le=1)
    lam: float = param(0.95, "GAE lambda.", ge=0, le=1)
    policy_loss: str = param(
        "token_mean",
        "Policy loss: token_mean (clipped, token-level), seq_mean (clipped, per-response mean), dr_grpo "
        "(constant normaliser), gspo (sequence-level ratio), cispo (clipped detached importance weight).",
        registered="POLICY_LOSSES",
    )
    clip_low: float = param(0.2, "Ratio clip below: 1 - clip_low.", gt=0, le=1)
    clip_high: float = param(0.2, "Ratio clip above: 1 + clip_high (> clip_low is DAPO's clip-higher).", gt=0)
    value_clip: float = param(0.2, "Value-loss clip around the rollout's values.", gt=0)
    entropy_coef: float = param(0.0, "Entropy bonus weight.", ge=0)
    grad_clip: float = param(1.0, "Clip each model's gradient norm to this value.", gt=0)
    kl_loss: str = param(
        "none",
        "KL to the reference as a loss term, by estimator: none, k1, k2, k3.",
        registered="KL_ESTIMATORS",
        extra_choices=("none",),
    )
    kl_in_reward: bool = param(True, "Penalise -kl_coef * log(pi/pi_ref) at every token, in the reward (k1).")
    kl_coef: float = param(0.05, "KL coefficient beta (in the reward and/or the loss).", ge=0)
    kl_target: float | None = param(4.0, "Adaptive KL: target KL per response in nats; null keeps kl_coef fixed.", gt=0)
    kl_horizon: int = param(10000, "Adaptive KL horizon (Ziegler et al., 2019), in responses.", ge=1)
    kl_budget: float = param(8.0, "Largest acceptable KL per response; the run warns above it.", gt=0)
    ref_reset_every: int | None = param(
        None, "Reset the reference to the current policy every N iterations (iterative GRPO); null: never.", ge=1
    )
    rewards: dict[str, float] = field(
        default_factory=lambda: {"reward_model": 1.0},
        metadata={
            "help": "Reward functions and their weights: accuracy, format, length, overlong, reward_model (the "
            "RLHF reward model), or module:function of your own (see tasks/rl/rewards.py)."
        },
    )
    reward_normalize: bool = param(True, "Scale the summed reward by its running mean and std.")
    reward_clip: float | None = param(5.0, "Clip the (normalised) reward to +-this; null: no clipping.", gt=0)
    reward_ensemble: str = param("mean", "How a reward-model ensemble's scores combine.", choices=("mean", "min"))
    reward_timeout_seconds: float = param(30.0, "Time budget of one reward function on one batch.", gt=0)
    reward_failure_warning: float = param(
        0.5,
        "Warn when a reward function fails (raises, times out, crashes) on more than this fraction of a batch.",
        ge=0,
        le=1,
    )
    overlong_buffer: int = param(16, "The overlong reward falls from 0 to -1 over the last N tokens.", ge=1)
    dynamic_sampling: bool = param(False, "Drop groups whose rewards are all equal and refill the batch (DAPO).")
    max_sampling_rounds: int = param(3, "Dynamic sampling: at most this many rollout rounds per iteration.", ge=1)
    critic_init: str = param(
        "reward", "Critic backbone from the reward model or the policy's initial model.", choices=("reward", "policy")
    )
    rollout_backend: str = param("hf", "Rollout engine: hf (transformers generate) or vllm.", choices=("hf", "vllm"))
    colocate: bool = param(
        True,
        "Run every role in the stage's process; false gives each role its own Ray actor. (Data-parallel trained "
        "roles and separate rollout engines are Ray actors either way.)",
    )
    roles: dict[str, StageResources] = field(
        default_factory=_default_roles,
        metadata={
            "help": "Ray resources of each role's actor when colocate is false: actor, critic, reference, reward, "
            "teacher; and of each rollout engine replica (rollout) when they run apart from the actor."
        },
    )
    parallel: ParallelConfig = section(
        ParallelConfig,
        "Data-parallel workers of each trained role (the actor, and the critic when there is one); each worker "
        "takes its share of every minibatch.",
    )
    rollout_engines: int = param(
        1,
        "Rollout engine replicas. One, with one actor worker, lives in the actor's process and samples from its "
        "weights; otherwise each replica is a Ray actor (roles.rollout) holding a copy of the policy, samples a "
        "contiguous share of each batch's prompts, and takes the actor's weights through the object store after "
        "each update (sync_every).",
        ge=1,
    )
    save_every: int = param(25, "Write a resumable checkpoint every N iterations.", ge=1)
    entropy_floor: float = param(0.05, "Warn when mean token entropy falls below this (collapse).", ge=0)
    sync_every: int = param(
        1,
        "Refresh the rollout engine's weights every N actor optimizer steps (a preference iteration takes one at "
        "the defaults, a policy-gradient one epochs x minibatches): 1 samples from the current policy (fully "
        "online); larger samples from a policy up to N - 1 steps old (semi-online; the policy-gradient update "
        "then takes the sampling policy's own log-probs as pi_old).",
        ge=1,
    )
    heldout_every: int | None = param(
        None,
        "Every N iterations (and before the first) sample the policy on a fixed held-out slice and log its gold "
        "reward (heldout/gold_reward): the dip and the recovery after a switch; null: never.",
        ge=1,
    )
    heldout_prompts: int = param(64, "Held-out prompts in that slice (the first N of the held-out split).", ge=1)


@dataclass
class PPOConfig(RLConfig):
    """RLHF's PPO: an RL stage whose starting policy (and KL reference) is a param."""

    init: str = param(
        "sft_cold",
        "The policy PPO starts from, and its KL reference. InstructGPT's SFT saw a small set of demonstrations: "
        "sft_cold (2 000 examples, pass@1 ~0.48) leaves RL room to gain; sft (20 000, pass@1 ~0.77) is at this "
        "model size's ceiling, where even the exact verifier gains nothing.",
    )
    verifier_rewards: dict[str, float] = field(
        default_factory=lambda: {"accuracy": 1.0},
        metadata={
            "help": "The rewards of ppo_verifier, the reference run: the same PPO from the same start with the "
            "exact verifier in place of the reward model, to show what the learned reward model costs."
        },
    )


LEARNERS = ("preference", "policy_gradient")


@dataclass
class OnlineDPOConfig(RLConfig, PreferenceLossConfig):
    """Online (and semi-online) preference optimisation, the RL loop with a preference update: each iteration
    samples ``group_size`` responses per prompt, scores them with ``rewards``, pairs each group's best with its
    worst (a group of ties makes no pair; dynamic sampling refills) and takes ``preference_loss`` against the fixed
    reference, the policy it starts from (iterative DPO's anchor), with log-probs at the rollout ``temperature``
    (1, as offline, by default). ``update: policy_gradient`` runs the GRPO/PPO update of these same params from
    the same start instead."""

    init: str = param("dpo", "The policy to start from, and the reference: the offline DPO checkpoint.")
    update: str = param(
        "preference",
        "What an iteration's scored responses train: preference (online DPO, with `preference_loss`) or policy_gradient "
        "(GRPO/PPO by `advantage` and `policy_loss`).",
        choices=LEARNERS,
    )


def _online_dpo_defaults() -> OnlineDPOConfig:
    grpo = _grpo_defaults()
    return OnlineDPOConfig(
        **{f.name: getattr(grpo, f.name) for f in dataclasses.fields(RLConfig)} | {"steps": 100, "heldout_every": 10}
    )


@dataclass
class DistillConfig(RLConfig):
    """On-policy distillation (Agarwal et al., 2024, GKD; Thinking Machines, 2025): the RL loop with the student as
    the actor and the teacher a frozen role that grades every token the student samples. ``distill_loss`` picks the
    divergence (``tasks/rl/distill_losses.py``); ``reward_coef`` mixes in the verifier's ``rewards`` through the
    ``advantage`` estimator; ``lmbda`` < 1 trains a fraction of iterations on the teacher's own responses."""

    teacher: str = param(
        "grpo",
        "The teacher: any model trained upstream (a model name). grpo, the R1 pipeline's best RL checkpoint, by "
        "default; its tokenizer must be the student's.",
    )
    init: str = param("sft_distill", "The student to start from: the student fine-tuned on the teacher's data.")
    distill_loss: str = param(
        "reverse_kl",
        "Distillation loss registered in tasks/rl/distill_losses.py: reverse_kl (the teacher's per-token log-ratio "
        "on the student's samples as a dense advantage) or gkd (generalised JSD over the full vocabulary).",
        registered="DISTILL_LOSSES",
    )
    jsd_beta: float = param(
        0.5,
        "gkd's beta: 0 is forward KL(teacher || student), 1 reverse KL(student || teacher), between them the "
        "generalised Jensen-Shannon divergence (scaled to meet both ends continuously).",
        ge=0,
        le=1,
    )
    lmbda: float = param(
        1.0,
        "GKD's lambda: the fraction of iterations trained on the student's own samples; the rest train on the "
        "teacher's verified responses (teacher_data). 1 is fully on-policy; below 1 needs a full-vocabulary loss.",
        ge=0,
        le=1,
    )
    reward_coef: float = param(
        0.0,
        "Weight of the verifier's reward (``rewards`` through ``advantage``) beside the distillation signal: the "
        "dense per-token signal plus a scalar task reward.",
        ge=0,
    )


def _distill_defaults() -> DistillConfig:
    # Measured (README): from an SFT student as good as the teacher, on-policy distillation pulls its greedy pass@1
    # toward the teacher's, down as well as up; more steps or a higher rate pull harder (1e-3 lost 0.04-0.1).
    # GRPO's loop settings, less what distillation does not use: the teacher is the anchor (no KL to a reference),
    # every response carries its signal (no dynamic sampling), one update per rollout (no clip to widen).
    grpo = _grpo_defaults()
    return DistillConfig(
        **{f.name: getattr(grpo, f.name) for f in dataclasses.fields(RLConfig)}
        | {
            "steps": 200,
            "group_size": 4,
            "clip_high": 0.2,
            "kl_loss": "none",
            "kl_coef": 0.0,
            "rewards": {"accuracy": 1.0},
            "dynamic_sampling": False,
            "roles": {role: StageResources(num_cpus=0.5) for role in ("actor", "reference", "teacher", "rollout")},
        }
    )


def _grpo_defaults() -> RLConfig:
    return RLConfig(
        steps=300,
        rollout_batch_size=32,
        group_size=8,
        minibatch_size=128,
        epochs=1,
        actor_lr=1e-4,
        warmup_steps=5,
        advantage="grpo",
        policy_loss="token_mean",
        clip_low=0.2,
        clip_high=0.28,
        kl_loss="k3",
        kl_in_reward=False,
        kl_coef=0.001,
        kl_target=None,
        rewards={"accuracy": 1.0, "format": 0.1},
        reward_normalize=False,
        reward_clip=None,
        dynamic_sampling=True,
    )


def _grpo_final_defaults() -> RLConfig:
    final = _grpo_defaults()
    final.steps = 50
    # Dividing by the group's std would blow the reward model's small share up to full-size advantages in every
    # group whose verifier rewards are all equal: the final RL would then chase the reward model, not correctness.
    final.advantage = "dr_grpo"
    # The RLHF reward model's small share breaks ties among equally verified responses (R1's mixed rewards).
    final.rewards = {"accuracy": 1.0, "format": 0.1, "overlong": 0.1, "reward_model": 0.05}
    return final


@dataclass
class RejectionSamplingConfig:
    """Sample N responses per training prompt from a policy, keep the verified ones
    (``tasks/data/rejection_sampling.py``)."""

    num_prompts: int = param(4000, "Training prompts to sample from (the first N of the training split).", ge=1)
    samples_per_prompt: int = param(8, "Responses sampled per prompt (N).", ge=1)
    temperature: float = param(1.0, "Sampling temperature.", gt=0)
    max_new_tokens: int = param(64, "Longest sampled response.", ge=1)
    max_per_prompt: int = param(2, "Distinct accepted responses kept per prompt, at most.", ge=1)


@dataclass
class RejectionConfig(RejectionSamplingConfig):
    top_by_reward_model: int = param(
        1, "For a prompt whose task has no verifier: keep this many best responses by the reward model.", ge=1
    )
    general_ratio: float = param(
        0.25, "General SFT rows (worked solutions of other training prompts) mixed in per accepted row.", ge=0
    )


@dataclass
class TeacherDataConfig(RejectionSamplingConfig):
    """Sequence-level distillation's data (DeepSeek-R1-Distill): the teacher's verified responses."""


@dataclass
class RoundConfig:
    policy: str = param("grpo", "The model (artifacts/<policy>) that rejection sampling samples from.")


def _default_rounds() -> dict[str, RoundConfig]:
    return {"1": RoundConfig()}


def _default_resources() -> dict[str, StageResources]:
    # A stage computes with torch's default thread count (the machine's cores): reserving fewer CPUs
    # would let Ray run stages side by side on the same cores, and oversubscribed threads run slower
    # than the same stages one after the other. On more cores, lower these to run stages in parallel.
    return {"default": StageResources(num_cpus=2.0)}


@dataclass
class RunnerConfig:
    """How the Prefect flows run the DAG; none of it changes what a stage produces."""

    ray_address: str | None = param(
        None, "Address of a running Ray cluster; null uses RAY_ADDRESS when set, else starts a local Ray."
    )
    retries: int = param(0, "Times Prefect retries a failed stage (it resumes from its last checkpoint).", ge=0)
    retry_delay_seconds: float = param(5.0, "Wait before a retry.", ge=0)
    resources: dict[str, StageResources] = field(
        default_factory=_default_resources,
        metadata={"help": "Ray resources by stage kind (data, base, sft, eval); 'default' for the others."},
    )
    schedules: dict[str, str] = field(
        default_factory=dict,
        metadata={
            "help": "Cron schedule of `alignflow retrain` by pipeline name for `alignflow serve`, e.g. "
            "{sft: '0 3 * * 1'}."
        },
    )


# What the gate can compare, each higher-is-better (response_length has no better direction): eval@<model>'s metrics.
GATE_METRICS = ("pass@1", "pass@k", "sample_accuracy", "gold_reward", "format_rate")


@dataclass
class RetrainConfig:
    """`alignflow retrain PIPELINE`: a candidate trained on the current data, gated against the `prod` champion."""

    metric: str = param(
        "pass@1", "The gate's primary metric, of eval@<model> on the held-out split.", choices=GATE_METRICS
    )
    margin: float = param(
        0.02,
        "Promote only when the candidate's metric beats the champion's by at least this: a tie or a gain within "
        "the held-out set's noise keeps the model in production.",
        ge=0,
    )
    guards: dict[str, float] = field(
        default_factory=lambda: {"format_rate": 0.05},
        metadata={
            "help": "Metrics that must not regress: metric -> the most the candidate may fall below the champion. "
            f"Metrics: {', '.join(GATE_METRICS)}."
        },
    )
    quarantine: str | None = param(
        "data/quarantine",
        "Where a rejected candidate's new shards move, out of data.train_file's reach, so the next candidate "
        "trains without them (move one back to retry it); null leaves them in place.",
    )


@dataclass
class RemoteConfig:
    """The DVC remote every finished run pushes its artifacts to (written into .dvc/config as `alignflow`)."""

    url: str = param(
        "~/.alignflow/remote",
        "A DVC remote URL: a directory (the default, one machine), s3://bucket/path, gs://, azure://, ssh://... "
        "(install the matching dvc extra, e.g. dvc-s3). Credentials come from the environment, never params.",
    )
    endpoint_url: str | None = param(
        None, "The endpoint of an S3-compatible server (MinIO, Ceph, moto): e.g. http://127.0.0.1:9000."
    )
    push: bool = param(True, "Push after every finished run; false keeps everything in the local cache.")


@dataclass
class Params:
    seed: int = param(0, "Seed of every random draw: data, initialisation, batches, sampling.", ge=0, le=SEED_MAX)
    device: str = param("auto", "Where to train: 'cpu', 'cuda', or 'auto' (cuda when available).", choices=DEVICES)
    task: TaskConfig = section(TaskConfig, "The synthetic problem family.")
    data: DataConfig = section(
        DataConfig,
        "Dataset sizes or files of your own.",
        StageKind(
            "data",
            "tasks.stages.data:run",
            "generate seeded train/held-out problem splits (or read your JSONL)",
            writes="dataset",
        ),
    )
    base: BaseConfig = section(
        BaseConfig,
        "The base model: built-in tiny model or a model path.",
        StageKind("base", "tasks.stages.base:run", "build the tiny built-in model, or load base.model_path", "model"),
    )
    sft: SFTConfig = section(
        SFTConfig,
        "Supervised fine-tuning on worked solutions.",
        StageKind(
            "sft",
            "tasks.stages.sft:run",
            "supervised fine-tuning on worked solutions (resumes after a crash)",
            "model",
            reads=("data", "${init}"),
        ),
    )
    eval: EvalConfig = section(
        EvalConfig,
        "Held-out evaluation.",
        StageKind(
            "eval",
            "tasks.stages.eval:run",
            "held-out pass@1, pass@k, gold reward, format rate, response length of MODEL",
            "evaluation",
            reads=("data", "${model}"),
            target="model",
        ),
    )
    preferences: PreferencesConfig = section(
        PreferencesConfig,
        "Preference pairs sampled from a policy, judged.",
        StageKind(
            "preferences",
            "tasks.stages.preferences:run",
            "sample K responses per prompt from a policy, label pairs with the noisy gold judge",
            "dataset",
            reads=("data", "${policy}"),
        ),
    )
    reward_backbone: RewardBackboneConfig = section(
        RewardBackboneConfig,
        "A dedicated reward-model backbone: its own size, fine-tuned on the task data.",
        StageKind(
            "reward_backbone",
            "tasks.stages.reward_backbone:run",
            "build a tiny model of the reward backbone's own size and fine-tune it on worked solutions",
            "model",
            reads=("data",),
        ),
    )
    reward_model: RewardModelConfig = section(
        RewardModelConfig,
        "Bradley-Terry reward model on the preference pairs.",
        StageKind(
            "reward_model",
            "tasks.stages.reward_model:run",
            "Bradley-Terry reward model(s) on the pairs; held-out pairwise accuracy",
            "reward models",
            reads=("preferences", "${backbone}"),
        ),
    )
    best_of_n: BestOfNConfig = section(
        BestOfNConfig,
        "Best-of-n on held-out prompts, picked by the reward model and scored by the gold judge.",
        StageKind(
            "best_of_n",
            "tasks.stages.best_of_n:run",
            "sample n responses per held-out prompt from a policy, keep the reward model's favourite: gold reward",
            "evaluation",
            reads=("data", "reward_model", "${policy}"),
        ),
    )
    ppo: PPOConfig = section(
        PPOConfig,
        "PPO against the reward model, KL-anchored to SFT.",
        StageKind(
            "ppo",
            "tasks.stages.ppo:run",
            "PPO: actor, critic, reference, reward roles; KL-shaped rewards, GAE (resumes)",
            "model",
            reads=("data", "${init}", "reward_model"),
        ),
        StageKind(
            "ppo_verifier",
            "tasks.stages.ppo:run_with_verifier",
            "the reference point: the same PPO from the same start, rewarded by the exact verifier",
            "model",
            reads=("data", "${init}"),
        ),
    )
    dpo: DPOConfig = section(
        DPOConfig,
        "Offline preference optimisation (the DPO family) on the preference pairs.",
        StageKind(
            "dpo_reference",
            "tasks.stages.dpo:run_reference",
            "the reference's log-probs of every preference pair, computed once (read by dpo)",
            "dataset",
            reads=("preferences", "${init}"),
        ),
        StageKind(
            "dpo",
            "tasks.stages.dpo:run",
            "offline preference optimisation on the pairs: dpo, ipo, cdpo, hinge, simpo, orpo (resumes)",
            "model",
            reads=("preferences", "dpo_reference", "${init}"),
        ),
    )
    online_dpo: OnlineDPOConfig = section(
        _online_dpo_defaults,
        "Online preference optimisation from the offline checkpoint: sample, score, pair, update.",
        StageKind(
            "online_dpo",
            "tasks.stages.online_dpo:run",
            "online / semi-online DPO (or GRPO/PPO) from the offline checkpoint, with the dip on held-out prompts",
            "model",
            reads=("data", "${init}"),
        ),
    )
    sft_cold: SFTConfig = section(
        _cold_start_defaults,
        "R1: cold-start SFT on a small set of worked solutions.",
        StageKind(
            "sft_cold",
            "tasks.stages.sft:run_cold_start",
            "R1 cold start: SFT on a small set of worked solutions",
            "model",
            reads=("data", "${init}"),
        ),
    )
    grpo: RLConfig = section(
        _grpo_defaults,
        "R1: reasoning RL with rule-based rewards (and R1-Zero, from base).",
        StageKind(
            "grpo",
            "tasks.stages.grpo:run",
            "R1 reasoning RL: GRPO-family RL with verifiable rewards (resumes)",
            "model",
            reads=("data", "sft_cold"),
        ),
        StageKind(
            "grpo_zero",
            "tasks.stages.grpo:run_zero",
            "R1-Zero: the same RL straight from the base model",
            "model",
            reads=("data", "base"),
        ),
    )
    rejection: RejectionConfig = section(
        RejectionConfig,
        "R1: rejection sampling from an RL checkpoint.",
        StageKind(
            "rejection",
            "tasks.stages.rejection:run",
            "R1 rejection sampling from the round's policy, verified, deduplicated",
            "dataset",
            reads=("data", "${round.policy}", "reward_model"),
            target="round",
        ),
    )
    sft_rs: SFTConfig = section(
        _sft_rs_defaults,
        "R1: SFT on the rejection-sampled data (each round).",
        StageKind(
            "sft_rs",
            "tasks.stages.sft:run_round",
            "R1 SFT on the round's rejection-sampled data",
            "model",
            reads=("rejection@${round}", "${init}"),
            target="round",
        ),
    )
    grpo_final: RLConfig = section(
        _grpo_final_defaults,
        "R1: the final RL stage with mixed rewards (each round).",
        StageKind(
            "grpo_final",
            "tasks.stages.grpo:run_final",
            "R1 final RL of the round with mixed rewards",
            "model",
            reads=("data", "sft_rs@${round}", "reward_model"),
            target="round",
        ),
    )
    rounds: dict[str, RoundConfig] = field(
        default_factory=_default_rounds,
        metadata={
            "help": "R1 rounds of rejection sampling -> SFT -> RL, by round name; each samples from its `policy` "
            "(round 1 from grpo, round 2 from grpo_final/1, ...)."
        },
    )
    student_base: StudentBaseConfig = section(
        StudentBaseConfig,
        "Distillation: the student before training, smaller than the teacher, with the teacher's tokenizer.",
        StageKind(
            "student_base",
            "tasks.stages.student_base:run",
            "build the distillation student (or load student_base.model_path) with the teacher's tokenizer",
            "model",
            reads=("${distill.teacher}",),
        ),
    )
    teacher_data: TeacherDataConfig = section(
        TeacherDataConfig,
        "Distillation: the teacher's verified responses, the student's SFT data.",
        StageKind(
            "teacher_data",
            "tasks.stages.teacher_data:run",
            "sample N responses per prompt from the teacher, keep the verified ones (sequence-level distillation)",
            "dataset",
            reads=("data", "${distill.teacher}"),
        ),
    )
    sft_distill: SFTConfig = section(
        _student_sft_defaults,
        "Distillation: SFT of the student on the teacher's verified responses.",
        StageKind(
            "sft_distill",
            "tasks.stages.sft:run_distill",
            "SFT of the student on the teacher's verified responses",
            "model",
            reads=("teacher_data", "${init}"),
        ),
    )
    distill: DistillConfig = section(
        _distill_defaults,
        "Distillation: on-policy, the teacher grading every token the student samples.",
        StageKind(
            "distill",
            "tasks.stages.distill:run",
            "on-policy distillation: the student samples, the teacher grades its tokens (reverse_kl, gkd)",
            "model",
            reads=("data", "teacher_data", "${init}", "${teacher}"),
        ),
    )
    runner: RunnerConfig = section(RunnerConfig, "Prefect and Ray: retries, resources, schedules.")
    retrain: RetrainConfig = section(RetrainConfig, "Scheduled retraining: the gate between candidate and champion.")
    remote: RemoteConfig = section(RemoteConfig, "Where artifacts live beyond this disk: a DVC remote.")


def stage_kinds() -> dict[str, tuple[StageKind, str]]:
    """Every stage kind by name, with the params section it runs with, in declaration order."""
    return {kind.name: (kind, f.name) for f in dataclasses.fields(Params) for kind in f.metadata.get("stages", ())}


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)
