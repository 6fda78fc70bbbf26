"""Typed configuration: one dataclass per stage, loaded from params.yaml with dotlist overrides.

omegaconf's structured configs reject unknown keys and values of the wrong type;
the field metadata here adds ranges and choices, checked in one walk so every
error names its full key (``sft.lr: must be > 0, got -0.001``). Each field's
``help`` documents it and feeds the CLI's ``--help`` and the Prefect parameter form.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from cronsim import CronSim, CronSimError
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

PROBLEM_NAMES = ("arithmetic", "countdown")
DEVICES = ("auto", "cpu", "cuda")


class ConfigError(ValueError):
    """A configuration that fails validation; the message names the offending key."""


def param(default: Any, help: str, **checks: Any) -> Any:
    """A documented field. ``checks``: gt, ge, le (numbers), choices, chars (allowed characters)."""
    return field(default=default, metadata={"help": help, **checks})


def section(cls: type, help: str) -> Any:
    return field(default_factory=cls, metadata={"help": help})


@dataclass
class ArithmeticConfig:
    digits: int = param(3, "Digits per operand (the multiplier of '*' is one digit).", ge=1, le=12)
    ops: str = param("+-*", "Operations to draw from, any of '+', '-', '*'.", chars="+-*")


@dataclass
class CountdownConfig:
    count: int = param(4, "Numbers given per puzzle; each must be used exactly once.", ge=2, le=6)
    max_number: int = param(25, "Numbers are drawn from 1..max_number.", ge=2)
    max_target: int = param(1000, "Upper bound on intermediate products, which bounds the target.", ge=10)


@dataclass
class TaskConfig:
    name: str = param("arithmetic", "Problem family to train and evaluate on.", choices=PROBLEM_NAMES)
    arithmetic: ArithmeticConfig = section(ArithmeticConfig, "Settings of the arithmetic family.")
    countdown: CountdownConfig = section(CountdownConfig, "Settings of the countdown family.")


@dataclass
class DataConfig:
    num_train: int = param(20000, "Generated training examples.", ge=1)
    num_test: int = param(200, "Generated held-out examples (never overlapping the training split).", ge=1)
    train_file: str | None = param(None, "A JSONL file of your own to train on instead of generating.")
    test_file: str | None = param(None, "A JSONL file of your own to evaluate on instead of generating.")


@dataclass
class BaseConfig:
    model_path: str | None = param(
        None, "A Hugging Face model directory to start from; null builds the tiny built-in model."
    )
    hidden_size: int = param(96, "Tiny model: width of the residual stream.", ge=8)
    num_layers: int = param(3, "Tiny model: transformer blocks.", ge=1)
    num_heads: int = param(4, "Tiny model: attention heads (must divide hidden_size).", ge=1)
    intermediate_size: int = param(384, "Tiny model: width of the MLP.", ge=8)
    max_position_embeddings: int = param(128, "Tiny model: longest sequence it can attend over.", ge=16)


@dataclass
class SFTConfig:
    lr: float = param(2e-3, "Peak AdamW learning rate.", gt=0)
    weight_decay: float = param(0.01, "AdamW decoupled weight decay.", ge=0)
    warmup_steps: int = param(50, "Linear warm-up steps before cosine decay.", ge=0)
    max_steps: int = param(600, "Optimizer steps.", ge=1)
    batch_size: int = param(64, "Sequences per optimizer step.", ge=1)
    max_prompt_length: int = param(32, "Longest prompt in tokens; a longer one is an error.", ge=1)
    max_length: int = param(96, "Longest prompt + response in tokens; a longer example is an error.", ge=2)
    grad_clip: float = param(1.0, "Clip the global gradient norm to this value.", gt=0)
    save_every: int = param(100, "Write a resumable checkpoint every N steps.", ge=1)
    log_every: int = param(20, "Log training metrics every N steps.", ge=1)


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
        0.53,
        "Bradley-Terry noise of preference labels: P(a preferred) = sigmoid((u_a - u_b) / label_noise); "
        "0 gives noise-free labels. The default makes training labels agree with the judge about 75% of the time.",
        ge=0,
    )


@dataclass
class PreferencesConfig:
    num_prompts: int = param(4000, "Training prompts to sample responses for (from the training split).", ge=1)
    samples_per_prompt: int = param(4, "Responses sampled per prompt (K); every pair of them is labelled.", ge=2)
    temperature: float = param(1.0, "Sampling temperature of the SFT policy.", gt=0)
    max_new_tokens: int = param(64, "Longest sampled response.", ge=1)
    judge: JudgeConfig = section(JudgeConfig, "The gold judge that labels pairs.")
    train_file: str | None = param(None, "Preference JSONL of your own to train the reward model on.")
    test_file: str | None = param(None, "Preference JSONL of your own to evaluate the reward model on.")


@dataclass
class RewardConfig:
    lr: float = param(1e-3, "Peak AdamW learning rate.", gt=0)
    weight_decay: float = param(0.01, "AdamW decoupled weight decay.", ge=0)
    warmup_steps: int = param(20, "Linear warm-up steps before cosine decay.", ge=0)
    epochs: int = param(2, "Passes over the preference pairs.", ge=1)
    batch_size: int = param(32, "Pairs per optimizer step.", ge=1)
    grad_clip: float = param(1.0, "Clip the global gradient norm to this value.", gt=0)
    ensemble_size: int = param(1, "Reward models trained from different seeds; PPO combines them.", ge=1)
    log_every: int = param(20, "Log training metrics every N steps.", ge=1)


def _default_roles() -> dict[str, StageResources]:
    return {role: StageResources(num_cpus=0.5) for role in ("actor", "critic", "reference", "reward")}


@dataclass
class PPOConfig:
    steps: int = param(150, "PPO iterations (roll out, score, update).", ge=1)
    rollout_batch_size: int = param(128, "Prompts rolled out per iteration (one response each).", ge=1)
    minibatch_size: int = param(64, "Responses per gradient step.", ge=1)
    epochs: int = param(2, "Passes over each rollout batch (K).", ge=1)
    actor_lr: float = param(1e-4, "Actor AdamW learning rate (constant after warm-up).", gt=0)
    critic_lr: float = param(5e-4, "Critic AdamW learning rate (constant after warm-up).", gt=0)
    warmup_steps: int = param(5, "Linear learning-rate warm-up, in iterations.", ge=0)
    temperature: float = param(1.0, "Rollout sampling temperature.", gt=0)
    max_new_tokens: int = param(64, "Longest rollout response.", ge=1)
    gamma: float = param(1.0, "GAE discount.", ge=0, le=1)
    lam: float = param(0.95, "GAE lambda.", ge=0, le=1)
    clip_low: float = param(0.2, "Policy ratio clip below: 1 - clip_low.", gt=0, le=1)
    clip_high: float = param(0.2, "Policy ratio clip above: 1 + clip_high (> clip_low is clip-higher).", gt=0)
    value_clip: float = param(0.2, "Value-loss clip around the rollout's values.", gt=0)
    entropy_coef: float = param(0.0, "Entropy bonus weight.", ge=0)
    grad_clip: float = param(1.0, "Clip each model's gradient norm to this value.", gt=0)
    kl_coef: float = param(0.05, "Initial KL penalty coefficient beta (per token, in the reward).", ge=0)
    kl_target: float | None = param(4.0, "Adaptive KL: target KL per response in nats; null keeps kl_coef fixed.", gt=0)
    kl_horizon: int = param(10000, "Adaptive KL horizon (Ziegler et al., 2019), in responses.", ge=1)
    kl_budget: float = param(8.0, "Largest acceptable final KL per response; the run warns above it.", gt=0)
    reward_normalize: bool = param(True, "Scale reward-model scores by their running mean and std.")
    reward_clip: float | None = param(5.0, "Clip (normalised) scores to +-this; null: no clipping.", gt=0)
    reward_ensemble: str = param("mean", "How the ensemble's scores combine: mean or min.", choices=("mean", "min"))
    critic_init: str = param(
        "reward", "Critic backbone and head from the reward model or the SFT model.", choices=("reward", "sft")
    )
    rollout_backend: str = param("hf", "Rollout engine: hf (transformers generate) or vllm.", choices=("hf", "vllm"))
    colocate: bool = param(True, "Run the four roles in the stage's process; false gives each role its own Ray actor.")
    roles: dict[str, StageResources] = field(
        default_factory=_default_roles,
        metadata={
            "help": "Ray resources of each role's actor when colocate is false: actor, critic, reference, reward."
        },
    )
    save_every: int = param(25, "Write a resumable checkpoint every N iterations.", ge=1)
    entropy_floor: float = param(0.05, "Warn when mean token entropy falls below this (collapse).", ge=0)


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
        metadata={"help": "Cron schedule by pipeline name for `alignflow serve`, e.g. {sft: '0 3 * * 1'}."},
    )


@dataclass
class Params:
    seed: int = param(0, "Seed of every random draw: data, initialisation, batches, sampling.", ge=0)
    device: str = param("auto", "Where to train: 'cpu', 'cuda', or 'auto' (cuda when available).", choices=DEVICES)
    task: TaskConfig = section(TaskConfig, "The synthetic problem family.")
    data: DataConfig = section(DataConfig, "Dataset sizes or files of your own.")
    base: BaseConfig = section(BaseConfig, "The base model: built-in tiny model or a model path.")
    sft: SFTConfig = section(SFTConfig, "Supervised fine-tuning on worked solutions.")
    eval: EvalConfig = section(EvalConfig, "Held-out evaluation.")
    preferences: PreferencesConfig = section(PreferencesConfig, "Preference pairs sampled from SFT, judged.")
    reward: RewardConfig = section(RewardConfig, "Bradley-Terry reward model on the preference pairs.")
    ppo: PPOConfig = section(PPOConfig, "PPO against the reward model, KL-anchored to SFT.")
    runner: RunnerConfig = section(RunnerConfig, "Prefect and Ray: retries, resources, schedules.")


def fields_with_keys(config: Any, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, Any]]:
    """Every leaf field of a config tree as (dotted key, field, value)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            yield from fields_with_keys(value, f"{key}.")
        elif isinstance(value, dict) and all(dataclasses.is_dataclass(v) for v in value.values()) and value:
            for name, item in value.items():
                yield from fields_with_keys(item, f"{key}.{name}.")
        else:
            yield key, f, value


def _range_errors(key: str, f: dataclasses.Field, value: Any) -> Iterator[str]:
    if value is None:
        return
    checks = f.metadata
    if "gt" in checks and not value > checks["gt"]:
        yield f"{key}: must be > {checks['gt']}, got {value}"
    if "ge" in checks and not value >= checks["ge"]:
        yield f"{key}: must be >= {checks['ge']}, got {value}"
    if "le" in checks and not value <= checks["le"]:
        yield f"{key}: must be <= {checks['le']}, got {value}"
    if "choices" in checks and value not in checks["choices"]:
        yield f"{key}: must be one of {', '.join(checks['choices'])}, got {value!r}"
    if "chars" in checks and (not value or set(value) - set(checks["chars"])):
        yield f"{key}: must be made of {', '.join(checks['chars'])}, got {value!r}"


def _cross_field_errors(params: Params) -> Iterator[str]:
    base, sft, evaluation = params.base, params.sft, params.eval
    if sft.max_length <= sft.max_prompt_length:
        yield f"sft.max_length: must exceed sft.max_prompt_length ({sft.max_prompt_length}), got {sft.max_length}"
    if base.model_path is None:
        if base.hidden_size % base.num_heads:
            yield f"base.num_heads: must divide base.hidden_size ({base.hidden_size}), got {base.num_heads}"
        longest = max(sft.max_length, sft.max_prompt_length + evaluation.max_new_tokens)
        if base.max_position_embeddings < longest:
            yield (
                f"base.max_position_embeddings: must be >= {longest} (the longest training or generated "
                f"sequence), got {base.max_position_embeddings}"
            )
    elif not Path(base.model_path).is_dir():
        yield f"base.model_path: no model directory at {base.model_path!r}"
    user_files = {
        "data.train_file": params.data.train_file,
        "data.test_file": params.data.test_file,
        "preferences.train_file": params.preferences.train_file,
        "preferences.test_file": params.preferences.test_file,
    }
    for key, path in user_files.items():
        if path is not None and not Path(path).is_file():
            yield f"{key}: no file at {path!r}"
    head_size = base.hidden_size // base.num_heads
    vllm_on_cpu = params.ppo.rollout_backend == "vllm" and params.device != "cuda" and base.model_path is None
    if vllm_on_cpu and not (head_size == 32 or (head_size >= 64 and head_size % 16 == 0)):
        yield (
            f"base.num_heads: ppo.rollout_backend=vllm on CPU needs a head size (base.hidden_size / base.num_heads) "
            f"of 32, 64, 80, 96, ..., got {head_size}"
        )
    if "default" not in params.runner.resources:
        yield "runner.resources: needs a 'default' entry"
    for pipeline, cron in params.runner.schedules.items():
        try:
            CronSim(cron, datetime.now())
        except CronSimError as error:
            yield f"runner.schedules.{pipeline}: not a cron expression: {cron!r} ({error})"


def validate(params: Params) -> Params:
    errors = [e for key, f, value in fields_with_keys(params) for e in _range_errors(key, f, value)]
    errors += _cross_field_errors(params)
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))
    return params


def _describe(error: OmegaConfBaseException) -> str:
    key = getattr(error, "full_key", None) or getattr(error, "key", None) or "?"
    message = str(error).splitlines()[0]
    if "not in" in message or "Could not find" in message:
        return f"{key}: unknown key"
    return f"{key}: {message}"


def load_params(path: str | Path = "params.yaml", overrides: list[str] | tuple[str, ...] = ()) -> Params:
    """Read ``path``, apply dotlist ``overrides`` (``sft.lr=1e-4``), validate, and return typed params."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such params file")
    for override in overrides:
        if "=" not in override:
            raise ConfigError(f"override {override!r}: expected key=value")
    try:
        from_file = OmegaConf.load(path)
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML ({str(error).splitlines()[0]})") from None
    try:
        merged = OmegaConf.merge(OmegaConf.structured(Params), from_file, OmegaConf.from_dotlist(list(overrides)))
        params = OmegaConf.to_object(merged)
    except OmegaConfBaseException as error:
        raise ConfigError(f"{path}: {_describe(error)}") from None
    return validate(params)


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)
