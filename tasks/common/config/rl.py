"""The params sections of the RL loop (PPO, GRPO, online DPO, on-policy distillation) and of rejection sampling."""

from __future__ import annotations

from typing import Annotated

from tasks.common.config.fields import OneOf, Weight, mapping, param, schema_section, section
from tasks.common.config.sections import (
    InferenceConfig,
    ModelTrainingConfig,
    ParallelConfig,
    PreferenceLossConfig,
    SamplingConfig,
    StageResources,
)

LR_SCHEDULES = ("constant", "cosine")
LEARNERS = ("preference", "policy_gradient")
_CORE_ALGOS = "tasks.rl.core_algos"
_CORRECTION = "tasks.rl.rollout_correction"
# A reward mix's name for the RLHF reward model, beside the built-in rewards (scored in the trainer's process: it
# is a torch model). Here rather than in tasks/rl/rewards.py: validating params reads it, and that module imports torch.
REWARD_MODEL = "reward_model"


def roles(*names: str) -> dict[str, StageResources]:
    """Half a CPU for each role's actor: on 2 cores, whole CPUs would not place the roles side by side."""
    return {role: StageResources(num_cpus=0.5) for role in names}


@schema_section
class VLLMConfig:
    """The vLLM engine as GPU users run it (``rollout_backend: vllm``)."""

    dtype: Annotated[str, OneOf(("auto", "bf16", "fp32"))] = param(
        "auto",
        "The engine's dtype: auto (the stage's compute dtype, from its precision), or bf16 / fp32 whatever the "
        "trainer computes in (a bfloat16 engine beside an fp32 trainer: the mismatch rollout_correction weighs).",
    )

    gpu_memory_utilization: float = param(
        0.3,
        "Share of the GPU's memory vLLM takes for its weights and KV cache; colocated with training, the rest is "
        "the trainer's.",
        gt=0,
        le=1,
    )
    sleep_mode: bool = param(
        False,
        "On a GPU, colocated: the engine sleeps through each update (weights offloaded to the CPU, KV cache freed) "
        "and wakes for the next rollout, so training has the memory.",
    )
    tensor_parallel_size: int = param(1, "GPUs one engine shards its model over.", ge=1)
    max_num_seqs: int = param(256, "Sequences vLLM schedules in one step.", ge=1)
    enforce_eager: bool = param(
        False,
        "Run the model eagerly, without compiling it or capturing CUDA graphs: the engine starts in seconds, not a "
        "minute or more, and decodes slower; for short runs.",
    )


@schema_section
class RolloutCorrectionConfig:
    """Correction for the engine that sampled a rollout (mu) differing from the trainer's pi_old on the same weights
    (``tasks/rl/rollout_correction.py``), on the per-token ratio pi_old/mu; policy-gradient updates read it."""

    weights: Annotated[str, OneOf(registry=f"{_CORRECTION}:IS_WEIGHTS", extra=("auto", "none"))] = param(
        "auto",
        "Truncated importance weights min(ratio, weight_cap) on the surrogate: token, sequence (the response's "
        "product of ratios), none, or auto (token where the engine can differ from the trainer: vllm, a "
        "training precision other than fp32, whose engine samples in bfloat16, or asynchronous rollouts "
        "(max_staleness > 0); none for a synchronous fp32 HF engine).",
    )
    weight_cap: float = param(2.0, "C of min(ratio, C).", ge=1)
    rejection: Annotated[str, OneOf(registry=f"{_CORRECTION}:REJECTIONS", extra=("none",))] = param(
        "none",
        "Drop the loss where the ratio is outside [1/rejection_bound, rejection_bound]: per token (IcePop), "
        "sequence (the response's product of ratios), geometric (its geometric mean), or none.",
    )
    rejection_bound: float = param(2.0, "C of [1/C, C].", ge=1)


@schema_section
class GuardConfig:
    """The over-optimisation guard (``tasks/rl/guard.py``): every ``every`` iterations the policy's samples on a
    fixed probe of prompts are judged by a signal it is not trained on, and the stage's artifact is the iteration
    that signal rates best, not the last one."""

    signal: Annotated[str, OneOf(("auto", "judge", "ensemble", "verifier", "none"))] = param(
        "auto",
        "judge: the reward model's judge (reward_model.judge: trained on the held-out preference pairs, which the "
        "training reward never saw); ensemble: the members' conservative score, mean - reward_ensemble_std_coef x "
        "std; verifier: the task's verifier (the share of probe samples it marks correct), for a stage not "
        "trained on it (distill without reward_coef, ppo on the reward model alone); none: keep the last "
        "iteration; auto: judge when the stage is rewarded by a reward model that has one, else none.",
    )
    every: int = param(10, "Iterations between probes (one also before the first and one after the last).", ge=1)
    prompts: int = param(
        64,
        "Prompts probed: the first N of the training split (the last N with held_out), group_size samples each "
        "(one greedy answer with greedy) from a seed of their own.",
        ge=1,
    )
    held_out: bool = param(
        False,
        "Probe the last `prompts` of the training split and never train on them: the probe then measures what the "
        "policy does on prompts it has not seen, as held-out evaluation does, and the verifier may judge a stage "
        "trained on it (early stopping on a validation split).",
    )
    greedy: bool = param(
        False,
        "Probe with one greedy answer per prompt, the answer held-out pass@1 reads, instead of group_size samples: "
        "RL can sharpen sampling toward answers it already gives greedily, raising a sampled probe while the greedy "
        "answers do not move.",
    )
    min_gain: float = param(
        0.0,
        "A later probe replaces the kept iteration only when its judged score is higher by more than this (in the "
        "signal's units): noise between probes should not move the choice.",
        ge=0,
    )
    min_z: float = param(
        0.0,
        "A later probe replaces the kept iteration only when, besides min_gain, its per-prompt scores beat the kept "
        "probe's by more than this many standard errors of their paired difference (the same prompts each time): "
        "a later, further-trained iteration must show it is better. 0: the score alone decides.",
        ge=0,
    )


@schema_section
class RLConfig(SamplingConfig, ModelTrainingConfig):
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
    micro_batch_size: int | None = param(
        None,
        "Responses per forward and backward pass of the actor's update, their gradients summed into the "
        "minibatch's one step (gradient accumulation): the update's memory grows with it, not with minibatch_size "
        "(its logits over the vocabulary are most of it). null: a worker's whole share of the minibatch at once.",
        ge=1,
    )
    epochs: int = param(2, "Passes over each rollout batch; epochs x minibatches = updates per batch (mu).", ge=1)
    actor_lr: float = param(1e-4, "Policy AdamW peak learning rate.", gt=0)
    critic_lr: float = param(5e-4, "Critic AdamW peak learning rate (estimators with a critic only).", gt=0)
    warmup_steps: int = param(5, "Linear learning-rate warm-up, in iterations.", ge=0)
    lr_schedule: Annotated[str, OneOf(LR_SCHEDULES)] = param(
        "constant", "After warm-up: constant, or cosine decay to 0 at the last iteration."
    )
    advantage: Annotated[str, OneOf(registry=f"{_CORE_ALGOS}:ADVANTAGE_ESTIMATORS")] = param(
        "gae", "Advantage estimator registered in tasks/rl/core_algos.py: gae (with a critic), grpo, dr_grpo, rloo, ..."
    )
    gamma: float = param(1.0, "Discount (gae, reinforce_pp).", ge=0, le=1)
    lam: float = param(0.95, "GAE lambda.", ge=0, le=1)
    policy_loss: Annotated[str, OneOf(registry=f"{_CORE_ALGOS}:POLICY_LOSSES")] = param(
        "ppo",
        "Policy surrogate registered in tasks/rl/core_algos.py, per token: ppo (the clipped ratio), gspo "
        "(sequence-level ratio), cispo (clipped detached importance weight).",
    )
    loss_agg_mode: Annotated[str, OneOf(registry=f"{_CORE_ALGOS}:LOSS_AGG_MODES")] = param(
        "token_mean",
        "How the per-token surrogate is reduced to a loss: token_mean (every token counts once, DAPO), "
        "seq_mean_token_mean (each response's mean, then the mean over responses: GRPO's), seq_mean_token_sum_norm "
        "(each response's sum over the constant max_new_tokens: Dr. GRPO's).",
    )
    clip_low: float = param(0.2, "Ratio clip below: 1 - clip_low.", gt=0, le=1)
    clip_high: float = param(0.2, "Ratio clip above: 1 + clip_high (> clip_low is DAPO's clip-higher).", gt=0)
    value_clip: float = param(0.2, "Value-loss clip around the rollout's values.", gt=0)
    entropy_coef: float = param(0.0, "Entropy bonus weight.", ge=0)
    grad_clip: float = param(1.0, "Clip each model's gradient norm to this value.", gt=0)
    kl_loss: Annotated[str, OneOf(registry=f"{_CORE_ALGOS}:KL_ESTIMATORS", extra=("none",))] = param(
        "none", "KL to the reference as a loss term, by estimator: none, k1, k2, k3."
    )
    kl_in_reward: bool = param(True, "Penalise -kl_coef * log(pi/pi_ref) at every token, in the reward (k1).")
    kl_coef: float = param(0.05, "KL coefficient beta (in the reward and/or the loss).", ge=0)
    kl_target: float | None = param(4.0, "Adaptive KL: target KL per response in nats; null keeps kl_coef fixed.", gt=0)
    kl_horizon: int = param(10000, "Adaptive KL horizon (Ziegler et al., 2019), in responses.", ge=1)
    kl_budget: float = param(8.0, "Largest acceptable KL per response; the run warns above it.", gt=0)
    kl_budget_stop: bool = param(
        False,
        "Stop updating once the policy's KL from its reference passes kl_budget (the iteration is logged as "
        "stopped_at); false only warns.",
    )
    guard: GuardConfig = section(GuardConfig, "The over-optimisation guard: which iteration becomes the artifact.")
    ref_reset_every: int | None = param(
        None, "Reset the reference to the current policy every N iterations (iterative GRPO); null: never.", ge=1
    )
    rewards: dict[str, Weight] = mapping(
        lambda: {REWARD_MODEL: 1.0},
        "Reward functions and their weights: accuracy (the verifier's credit, part credit included), correct (1 "
        "for full credit only), format, length, overlong, reward_model (the RLHF reward model), or module:function "
        "of your own (see tasks/rl/rewards.py).",
    )
    reward_normalize: bool = param(True, "Scale the summed reward by its running mean and std.")
    reward_clip: float | None = param(5.0, "Clip the (normalised) reward to +-this; null: no clipping.", gt=0)
    reward_ensemble: Annotated[str, OneOf(registry="tasks.algos.reward_models:REWARD_ENSEMBLES")] = param(
        "mean",
        "How a reward-model ensemble's scores combine: mean, min (worst case), or mean_minus_std (mean - "
        "reward_ensemble_std_coef x std: uncertainty-weighted, Coste et al. 2024).",
    )
    reward_ensemble_std_coef: float = param(
        1.0, "lambda of mean_minus_std: how much the members' disagreement costs a response.", ge=0
    )
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
    critic_init: Annotated[str, OneOf(("reward", "policy"))] = param(
        "reward", "Critic backbone from the reward model or the policy's initial model."
    )
    rollout_backend: Annotated[str, OneOf(("hf", "vllm"))] = param(
        "hf", "Rollout engine: hf (transformers generate) or vllm."
    )
    vllm: VLLMConfig = section(VLLMConfig, "The vLLM engine's GPU settings (rollout_backend: vllm).")
    rollout_correction: RolloutCorrectionConfig = section(
        RolloutCorrectionConfig, "Importance weights and rejection for the engine-trainer mismatch."
    )
    colocate: bool = param(
        True,
        "Run every role in the stage's process; false gives each role its own Ray actor. (Data-parallel trained "
        "roles and separate rollout engines are Ray actors either way.)",
    )
    roles: dict[str, StageResources] = mapping(
        lambda: roles("actor", "critic", "reference", "reward", "rollout"),
        "Ray resources of each role's actor when colocate is false: actor, critic, reference, reward, teacher; and "
        "of each rollout engine replica (rollout) when they run apart from the actor.",
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
    max_staleness: int = param(
        0,
        "Asynchronous rollouts: the rollout engines sample the next N iterations' prompts while the actor trains, "
        "so a rollout comes from a policy up to N iterations old (exactly N once the run is N in); its tokens keep "
        "the engine's log-probs and rollout_correction weighs them (auto: token weights). 0 samples, then trains "
        "(synchronous). Needs engines apart from the actor (rollout_engines >= 2, or parallel.num_workers >= 2).",
        ge=0,
    )
    heldout_every: int | None = param(
        None,
        "Every N iterations (and before the first) sample the policy on a fixed held-out slice and log its gold "
        "reward (heldout/gold_reward): the dip and the recovery after a switch; null: never.",
        ge=1,
    )
    heldout_prompts: int = param(64, "Held-out prompts in that slice (the first N of the held-out split).", ge=1)


def engine_in_actor(cfg: RLConfig) -> bool:
    """Whether the rollout engine lives in the actor's process (one engine, one actor worker)."""
    return cfg.rollout_engines == 1 and cfg.parallel.num_workers == 1


@schema_section
class PPOConfig(RLConfig):
    """RLHF's PPO: an RL stage whose starting policy (and KL reference) is a param."""

    init: str = param(
        "sft_cold",
        "The policy PPO starts from, and its KL reference. InstructGPT's SFT saw a small set of demonstrations: "
        "sft_cold (2 000 examples) leaves RL room to gain; sft (20 000) is at this model size's ceiling, where "
        "even the exact verifier gains nothing.",
    )
    verifier_rewards: dict[str, Weight] = mapping(
        lambda: {"accuracy": 1.0},
        "The rewards of ppo_verifier, the reference run: the same PPO from the same start with the exact verifier "
        "in place of the reward model, to show what the learned reward model costs.",
    )


@schema_section
class OnlineDPOConfig(RLConfig, PreferenceLossConfig):
    """Online (and semi-online) preference optimisation, the RL loop with a preference update: each iteration
    samples ``group_size`` responses per prompt, scores them with ``rewards``, pairs each group's best with its
    worst (a group of ties makes no pair; dynamic sampling refills) and takes ``preference_loss`` against the
    fixed reference, the policy it starts from (iterative DPO's anchor), with log-probs at the rollout
    ``temperature``. ``update: policy_gradient`` runs the GRPO/PPO update of these same params instead."""

    init: str = param("dpo", "The policy to start from, and the reference: the offline DPO checkpoint.")
    update: Annotated[str, OneOf(LEARNERS)] = param(
        "preference",
        "What an iteration's scored responses train: preference (online DPO, with `preference_loss`) or "
        "policy_gradient (GRPO/PPO by `advantage` and `policy_loss`).",
    )


@schema_section
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
    distill_loss: Annotated[str, OneOf(registry="tasks.rl.distill_losses:DISTILL_LOSSES")] = param(
        "reverse_kl",
        "reverse_kl (the teacher's log-ratio on the student's samples, a dense advantage) or gkd (vocabulary JSD).",
    )
    lmbda: float = param(
        1.0,
        "GKD's lambda: the fraction of iterations trained on the student's own samples; the rest train on the "
        "teacher's verified responses (teacher_data). 1 is fully on-policy; below 1 needs a full-vocabulary loss.",
        ge=0,
        le=1,
    )
    jsd_beta: float = param(
        0.5,
        "gkd's beta: 0 is forward KL(teacher || student), 1 reverse KL(student || teacher), between them the "
        "generalised Jensen-Shannon divergence (scaled to meet both ends continuously).",
        ge=0,
        le=1,
    )
    reward_coef: float = param(
        0.0,
        "Weight of the verifier's reward (``rewards`` through ``advantage``) beside the distillation signal: the "
        "dense per-token signal plus a scalar task reward.",
        ge=0,
    )


# R1's reasoning RL (DAPO's recipe on GRPO): the defaults of grpo, and the base of every RL section derived from it.
GRPO = {
    "steps": 300,
    "rollout_batch_size": 32,
    "group_size": 8,
    "minibatch_size": 128,
    "epochs": 1,
    "actor_lr": 1e-4,
    "warmup_steps": 5,
    "advantage": "grpo",
    "policy_loss": "ppo",
    "loss_agg_mode": "token_mean",
    "clip_low": 0.2,
    "clip_high": 0.28,
    "kl_loss": "k3",
    "kl_in_reward": False,
    "kl_coef": 0.001,
    "kl_target": None,
    "rewards": {"accuracy": 1.0, "format": 0.1},
    "reward_normalize": False,
    "reward_clip": None,
    "dynamic_sampling": True,
}
GRPO_FINAL = GRPO | {
    "steps": 50,
    # Dividing by the group's std would blow the reward model's small share up to full-size advantages in every
    # group whose verifier rewards are all equal: the final RL would then chase the reward model, not correctness.
    "advantage": "dr_grpo",
    # The RLHF reward model's small share breaks ties among equally verified responses (R1's mixed rewards).
    "rewards": {"accuracy": 1.0, "format": 0.1, "overlong": 0.1, "reward_model": 0.05},
}
ONLINE_DPO = GRPO | {"steps": 100, "heldout_every": 10}
# GRPO's loop, less what distillation does not use: the teacher is the anchor (no KL to a reference), every
# response carries its signal (no dynamic sampling), one update per rollout (no clip to widen).
DISTILL = GRPO | {
    "steps": 200,
    "group_size": 4,
    "clip_high": 0.2,
    "kl_loss": "none",
    "kl_coef": 0.0,
    "rewards": {"accuracy": 1.0},
    "dynamic_sampling": False,
    "roles": roles("actor", "reference", "teacher", "rollout"),
}


@schema_section
class RejectionSamplingConfig(InferenceConfig):
    """Sample N responses per training prompt from a policy, keep the verified ones
    (``tasks/stages/rejection_sampling.py``)."""

    num_prompts: int = param(4000, "Training prompts to sample from (the first N of the training split).", ge=1)
    samples_per_prompt: int = param(8, "Responses sampled per prompt (N).", ge=1)
    max_per_prompt: int = param(2, "Distinct accepted responses kept per prompt, at most.", ge=1)


@schema_section
class RejectionConfig(RejectionSamplingConfig):
    top_by_reward_model: int = param(
        1, "For a prompt whose task has no verifier: keep this many best responses by the reward model.", ge=1
    )
    general_ratio: float = param(
        0.25, "General SFT rows (worked solutions of other training prompts) mixed in per accepted row.", ge=0
    )


@schema_section
class TeacherDataConfig(RejectionSamplingConfig):
    """Sequence-level distillation's data (DeepSeek-R1-Distill): the teacher's verified responses."""


@schema_section
class RoundConfig:
    policy: str = param("grpo", "The model (artifacts/<policy>) that rejection sampling samples from.")


@schema_section
class RLSections:
    """The sections of params.yaml for the RL stages, rejection sampling and R1's rounds: ``Params`` holds them."""

    ppo: PPOConfig = section(PPOConfig, "PPO against the reward model, KL-anchored to SFT.")
    online_dpo: OnlineDPOConfig = section(
        OnlineDPOConfig,
        "Online preference optimisation from the offline checkpoint: sample, score, pair, update.",
        **ONLINE_DPO,
    )
    grpo: RLConfig = section(RLConfig, "R1: reasoning RL with rule-based rewards (and R1-Zero, from base).", **GRPO)
    rejection: RejectionConfig = section(RejectionConfig, "R1: rejection sampling from an RL checkpoint.")
    grpo_final: RLConfig = section(RLConfig, "R1: the final RL stage with mixed rewards (each round).", **GRPO_FINAL)
    rounds: dict[str, RoundConfig] = mapping(
        lambda: {"1": RoundConfig()},
        "R1 rounds of rejection sampling -> SFT -> RL, by round name; each samples from its `policy` (round 1 from "
        "grpo, round 2 from grpo_final/1, ...).",
    )
    teacher_data: TeacherDataConfig = section(
        TeacherDataConfig, "Distillation: the teacher's verified responses, the student's SFT data."
    )
    distill: DistillConfig = section(
        DistillConfig, "Distillation: on-policy, the teacher grading every token the student samples.", **DISTILL
    )
