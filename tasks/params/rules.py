"""The rules of params that no single field states: the cross-field checks that ``load_params`` runs once
every field has passed the schema (a batch that splits over the workers, a model key that names a model
trained earlier, data of your own under data/), and the one slow check, importing your reward functions."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from models.sources import has_chat_template, source_error
from tasks.common.artifacts import USER_DATA
from tasks.common.config import (
    DistillConfig,
    ModelSizeConfig,
    OnlineDPOConfig,
    Params,
    PPOConfig,
    RLConfig,
    RoundConfig,
    SFTTrainingConfig,
    engine_in_actor,
)
from tasks.common.config.fields import schema_fields
from tasks.common.config.rl import REWARD_MODEL
from tasks.common.registry import param_reference, param_value
from tasks.common.registry_catalog import registry_entries
from tasks.data.datasets import is_shard_of, shard_files
from tasks.kinds import model_kinds, problem_kinds, prompt_limit_key, stage_kinds
from tasks.params.operations_rules import operations_errors
from tasks.params.task_rules import task_errors
from tasks.params.training_rules import runs_on_gpu, training_errors


def sections_of(config_type: type) -> tuple[str, ...]:
    """The params sections of one schema type (every RL stage's section is an ``RLConfig``)."""
    return tuple(
        name
        for name, info in schema_fields(Params).items()
        if isinstance(info.annotation, type) and issubclass(info.annotation, config_type)
    )


RL_SECTIONS = sections_of(RLConfig)
SFT_SECTIONS = sections_of(SFTTrainingConfig)
# Models the pipelines train, by name: what `init` and `rounds.<round>.policy` may point at.
MODELS, ROUND_MODELS = model_kinds()  # a round's model is named <kind>/<round>: sft_rs/1
_ROUND_NAME = re.compile(r"[A-Za-z0-9_-]+")
_GLOB = re.compile(r"[*?\[]")


def _is_model(name: str, rounds: dict[str, RoundConfig]) -> bool:
    kind, _, round_name = name.partition("/")
    return (name in MODELS) or (kind in ROUND_MODELS and round_name in rounds)


def _trained_from(model: str, params: Params) -> set[str]:
    """The stage kinds behind the model named ``model`` (``sft_rs/1``: sft_rs, rejection, grpo, ...), its own too,
    following each kind's declared reads through the values params give them."""
    kinds, found, pending = stage_kinds(), set(), [model.partition("/")[0]]
    while pending:
        kind = pending.pop()
        if kind in found or kind not in kinds:
            continue
        found.add(kind)
        for read in kinds[kind].reads.values():
            name, key = read.partition("@")[0], param_reference(read, kinds[kind].section)
            if name == "${round.policy}":
                pending += [spec.policy.partition("/")[0] for spec in params.rounds.values()]
            elif key is not None:
                pending.append(str(param_value(params, key)).partition("/")[0])
            elif not name.startswith("${"):
                pending.append(name)
    return found


def _model_key_errors(params: Params) -> Iterator[str]:
    """Every model-valued key (``sft.init``, ``ppo.init``, ``reward_model.backbone``, ``distill.teacher``) names a
    model whose stage runs before the stages that read it: one that exists, and not one trained from them (a
    cycle)."""
    reported = set()
    for kind in stage_kinds().values():
        for read in kind.reads.values():
            key = param_reference(read, kind.section)
            if key is None or key in reported:
                continue
            model = param_value(params, key)
            if not _is_model(model, params.rounds) or kind.name in _trained_from(model, params):
                reported.add(key)
                yield f"{key}: not a model trained before {kind.name} ({', '.join(MODELS)}, ...), got {model!r}"


# The registries the rules read, by the catalog's "module:NAME" (no torch: tasks/common/registry_catalog.py).
_ADVANTAGE_ESTIMATORS = "tasks.rl.core_algos:ADVANTAGE_ESTIMATORS"
_BUILT_IN_REWARDS = "tasks.rl.rewards:BUILT_IN"
_REWARD_KINDS = "tasks.rl.reward_kinds:REWARD_KINDS"
_DISTILL_LOSSES = "tasks.rl.distill_losses:DISTILL_LOSSES"


def _base_section(section: str, params: Params) -> str:
    """The section of the base model behind the stages of ``section`` (base, or agent_base for the agent
    pipeline's): the kind with a model source in their lineage."""
    lineage = set().union(*(_trained_from(k.name, params) for k in stage_kinds().values() if k.section == section))
    return next((k.section for k in stage_kinds().values() if k.source is not None and k.name in lineage), "base")


def _rl_errors(name: str, cfg: RLConfig, params: Params) -> Iterator[str]:
    base_name = _base_section(name, params)
    base = getattr(params, base_name)
    estimator = registry_entries(_ADVANTAGE_ESTIMATORS).get(cfg.advantage)  # an unknown name is reported by its field
    # distillation scores its samples by the rewards only to mix them in (reward_coef)
    trains_on_rewards = not (isinstance(cfg, DistillConfig) and cfg.reward_coef == 0)
    compares_group = trains_on_rewards and estimator is not None and estimator.compares_group
    if cfg.group_size < 2 and (compares_group or cfg.dynamic_sampling):
        why = f"advantage={cfg.advantage}" if compares_group else "dynamic sampling"
        yield f"{name}.group_size: {why} compares the responses of a prompt, needs >= 2, got {cfg.group_size}"
    if isinstance(cfg, OnlineDPOConfig) and cfg.update == "preference":
        if cfg.group_size < 2 and not cfg.dynamic_sampling:  # dynamic sampling's own error says the same
            yield f"{name}.group_size: the preference update pairs the responses of a prompt, needs >= 2, got 1"
        if cfg.ref_reset_every is not None:
            yield (
                f"{name}.ref_reset_every: the preference update keeps its reference fixed (the policy it starts "
                f"from, as iterative DPO does); null, got {cfg.ref_reset_every}"
            )
    # A stage reads the reward model only when dvc.yaml says so (its kind reads reward_model).
    reads_reward_model = any(
        "reward_model" in kind.reads.values() for kind in stage_kinds().values() if kind.section == name
    )
    rule_based_rewards = registry_entries(_BUILT_IN_REWARDS)
    rule_based = tuple(rule_based_rewards)
    built_in = (*rule_based, REWARD_MODEL)
    if not reads_reward_model and cfg.rewards.get(REWARD_MODEL):
        yield (
            f"{name}.rewards.{REWARD_MODEL}: the {name} stage does not read the reward model (its dvc.yaml "
            "stage has no artifacts/reward_model dependency); use a stage that does (ppo, grpo_final)"
        )
    mixes = {"rewards": (cfg.rewards, built_in)}
    if isinstance(cfg, PPOConfig):  # the reference run's rewards are rule-based: no reward model
        mixes["verifier_rewards"] = (cfg.verifier_rewards, rule_based)
    for key, (mix, allowed) in mixes.items():
        for reward, weight in mix.items():
            if reward not in allowed and ":" not in reward:
                yield f"{name}.{key}.{reward}: not a reward ({', '.join(allowed)}, or module:function of your own)"
            if not math.isfinite(weight):
                yield f"{name}.{key}.{reward}: the weight must be a finite number, got {weight}"
    rewarded_by_model = reads_reward_model and bool(cfg.rewards.get(REWARD_MODEL))
    if cfg.guard.signal in ("judge", "ensemble") and not rewarded_by_model:
        yield (
            f"{name}.guard.signal: {cfg.guard.signal} judges the reward model's exploitation, and {name} is not "
            f"rewarded by the reward model ({name}.rewards.{REWARD_MODEL}); auto or none"
        )
    if cfg.guard.signal == "judge" and not params.reward_model.judge:
        yield f"{name}.guard.signal: judge reads the reward model's judge; set reward_model.judge=true"
    verifier_rewards = [
        reward
        for reward, weight in cfg.rewards.items()
        if weight and reward in rule_based_rewards and rule_based_rewards[reward].grades_correctness
    ]
    if cfg.guard.signal == "verifier" and trains_on_rewards and verifier_rewards and not cfg.guard.held_out:
        yield (
            f"{name}.guard.signal: verifier is a held-out signal only for a stage not trained on it, and {name} is "
            f"rewarded by it ({name}.rewards.{verifier_rewards[0]}); judge, ensemble, auto or none, or probe "
            f"prompts it never trains on ({name}.guard.held_out=true)"
        )
    if cfg.guard.signal not in ("auto", "none") and cfg.parallel.strategy == "fsdp" and cfg.parallel.num_workers > 1:
        yield (
            f"{name}.guard.signal: the guard keeps a whole copy of the policy's weights, which fsdp workers shard; "
            f"none, or {name}.parallel.strategy=ddp"
        )
    if cfg.max_staleness >= cfg.steps:
        yield (
            f"{name}.max_staleness: {cfg.max_staleness} iterations of staleness in a run of {name}.steps="
            f"{cfg.steps} would train every iteration on the starting policy's samples; at most steps - 1"
        )
    correction = cfg.rollout_correction
    if correction.rejection != "none" and correction.rejection_bound == 1:
        yield (
            f"{name}.rollout_correction.rejection_bound: 1 keeps only the tokens whose ratio pi_old/mu is exactly 1, "
            "so any gap between the engine and the trainer (bfloat16, another kernel, a stale policy) rejects every "
            "token; above 1 (2 is IcePop's), or rejection: none"
        )
    if cfg.max_staleness and engine_in_actor(cfg):
        yield (
            f"{name}.max_staleness: asynchronous rollouts sample on rollout engine actors while the actor trains, "
            f"and with {name}.rollout_engines=1 and {name}.parallel.num_workers=1 the engine lives in the actor's "
            f"process; set {name}.rollout_engines >= 2 (or max_staleness 0), got {cfg.max_staleness}"
        )
    # Asked only where the answer matters: device auto asks torch, whose import is most of a no-op run's time.
    if cfg.vllm.sleep_mode and not runs_on_gpu(params.device):
        yield f"{name}.vllm.sleep_mode: vLLM sleeps on a GPU only (device: cuda); false on a CPU"
    if cfg.vllm.tensor_parallel_size > 1:
        import torch

        if not runs_on_gpu(params.device):
            yield f"{name}.vllm.tensor_parallel_size: shards over GPUs (device: cuda); 1 on a CPU"
        elif cfg.vllm.tensor_parallel_size > torch.cuda.device_count():
            gpus = torch.cuda.device_count()
            yield f"{name}.vllm.tensor_parallel_size: {cfg.vllm.tensor_parallel_size} GPUs, {gpus} seen"
    if base.model_path is None:
        limit = prompt_limit_key(name)
        longest = param_value(params, limit) + cfg.max_new_tokens
        if base.max_position_embeddings < longest:
            yield (
                f"{name}.max_new_tokens: a prompt of {limit} plus {cfg.max_new_tokens} new tokens "
                f"exceeds {base_name}.max_position_embeddings ({base.max_position_embeddings})"
            )
        head_size = base.hidden_size // base.num_heads
        vllm_on_cpu = cfg.rollout_backend == "vllm" and params.device != "cuda"
        if vllm_on_cpu and not (head_size == 32 or (head_size >= 64 and head_size % 16 == 0)):
            yield (
                f"{base_name}.num_heads: {name}.rollout_backend=vllm on CPU needs a head size ({base_name}.hidden_size"
                f" / {base_name}.num_heads) of 32, 64, 80, 96, ..., got {head_size}"
            )


def _tokenizer_of(model: str, params: Params):
    """The tokenizer of the model named ``model``, before it exists: every model of the DAG has the base model's,
    or (a reward backbone's lineage) the built-in one."""
    from models import build_char_tokenizer, load_tokenizer

    from_base = "base" in _trained_from(model, params) and params.base.model_path is not None
    return load_tokenizer(params.base.model_path) if from_base else build_char_tokenizer()


def _reward_model_errors(params: Params) -> Iterator[str]:
    """A reward-model kind's needs: a reference upstream (implicit), a one-token verdict (generative), and more
    than one member only where members differ (a kind that trains)."""
    cfg = params.reward_model
    kind = registry_entries(_REWARD_KINDS).get(cfg.kind)  # an unknown name is reported by its field
    if kind is None:
        return
    if not kind.trains and cfg.ensemble_size > 1:
        yield (
            f"reward_model.ensemble_size: the {cfg.kind} kind trains nothing, so its members would be one model "
            f"repeated; 1, got {cfg.ensemble_size}"
        )
    if kind.needs_reference:
        from tasks.rl.reward_kinds import implicit_reference  # torch: only for a kind that reads a reference

        if implicit_reference(params, cfg.backbone) is None:
            yield (
                f"reward_model.kind: {cfg.kind} scores beta log pi/pi_ref and needs a backbone trained against a "
                f"reference by a preference loss (dpo, online_dpo); reward_model.backbone={cfg.backbone} has no "
                "reference upstream"
            )
    if kind.suffix and (params.base.model_path is None or source_error(params.base.model_path) is None):
        from tasks.rl.reward_kinds import Scoring, verdict_id  # torch: only for a kind that asks for a verdict

        try:
            verdict_id(_tokenizer_of(cfg.backbone, params), Scoring(cfg.kind, cfg.verdict_suffix, cfg.verdict_token))
        except ValueError as error:
            yield f"{error} (reward_model.backbone={cfg.backbone})"


def _distill_errors(params: Params, longest: int) -> Iterator[str]:
    """On-policy distillation's knobs that only make sense together, and the student's size or tokenizer."""
    cfg = params.distill
    loss = registry_entries(_DISTILL_LOSSES).get(cfg.distill_loss)  # an unknown name is reported by its field
    if cfg.lmbda < 1 and loss is not None and not loss.full_vocabulary:
        yield (
            "distill.lmbda: below 1 trains on the teacher's responses, which a sampled-token loss "
            f"({cfg.distill_loss}) cannot grade (its estimate needs the student's own samples); use loss gkd, or "
            f"lmbda 1, got {cfg.lmbda}"
        )
    estimator = registry_entries(_ADVANTAGE_ESTIMATORS).get(cfg.advantage)
    if estimator is not None and estimator.needs_critic:
        yield f"distill.advantage: {cfg.advantage} needs a critic, which distillation does not train (grpo, rloo, ...)"
    if cfg.kl_in_reward:
        yield "distill.kl_in_reward: distillation shapes no reward; kl_loss puts a KL to the start in the loss"
    if cfg.ref_reset_every is not None:
        yield f"distill.ref_reset_every: distillation keeps no resettable reference; null, got {cfg.ref_reset_every}"
    student = params.student_base
    if student.from_teacher:
        if student.model_path is not None:
            yield "student_base.model_path: unused with student_base.from_teacher (the student is the teacher's layers)"
        return
    if student.model_path is None:
        yield from _size_errors("student_base", student, max(longest, params.sft_distill.max_length))
        return
    if not (Path(student.model_path) / "config.json").is_file():
        yield f"student_base.model_path: {student.model_path!r} is not a Hugging Face model directory"
        return
    from models import load_tokenizer, vocabulary_mismatch

    mismatch = vocabulary_mismatch(load_tokenizer(student.model_path), _tokenizer_of(cfg.teacher, params))
    if mismatch is not None:
        yield (
            f"student_base.model_path: the tokenizer of {student.model_path!r} is not the teacher's "
            f"(distill.teacher={cfg.teacher}): {mismatch}"
        )


def _size_errors(name: str, size: ModelSizeConfig, longest: int) -> Iterator[str]:
    """A tiny model's size: heads that divide its width, and positions for the ``longest`` sequence it sees."""
    if size.hidden_size % size.num_heads:
        yield f"{name}.num_heads: must divide {name}.hidden_size ({size.hidden_size}), got {size.num_heads}"
    if size.max_position_embeddings < longest:
        yield (
            f"{name}.max_position_embeddings: must be >= {longest} (the longest training or generated "
            f"sequence), got {size.max_position_embeddings}"
        )


def _device_errors(params: Params) -> Iterator[str]:
    """``device: cuda`` needs a GPU where the stages run: here, unless they run on a Ray cluster's workers."""
    if params.device != "cuda" or params.runner.ray_address or os.environ.get("RAY_ADDRESS"):
        return
    import torch  # only for a params file that asks for a GPU

    if not torch.cuda.is_available():
        yield (
            "device: 'cuda', but no GPU is visible here (torch.cuda.is_available() is false); use cpu, auto (a GPU "
            "when there is one), or runner.ray_address for a Ray cluster's GPU workers"
        )


def cross_field_errors(params: Params) -> Iterator[str]:
    yield from _device_errors(params)
    base, evaluation = params.base, params.eval
    for name in SFT_SECTIONS:
        sft = getattr(params, name)
        if sft.parallel.num_workers >= 1 and sft.batch_size % sft.parallel.num_workers:
            yield (
                f"{name}.batch_size: {sft.batch_size} sequences do not split evenly over "
                f"{name}.parallel.num_workers={sft.parallel.num_workers} workers"
            )
        if sft.max_length <= sft.max_prompt_length:
            yield (
                f"{name}.max_length: must exceed {name}.max_prompt_length ({sft.max_prompt_length}), "
                f"got {sft.max_length}"
            )
    # What each data-parallel section splits over its workers: (key, what a batch holds).
    splits = {"reward_model": ("batch_size", "pairs"), "dpo": ("batch_size", "pairs")}
    splits |= {name: ("minibatch_size", "responses") for name in RL_SECTIONS}
    for name, (key, unit) in splits.items():
        cfg = getattr(params, name)
        workers, batch_size = cfg.parallel.num_workers, getattr(cfg, key)
        if workers >= 1 and batch_size % workers:  # fewer is reported by its own range check
            yield (
                f"{name}.{key}: {batch_size} {unit} do not split evenly over {name}.parallel.num_workers={workers} "
                "workers"
            )
    yield from _model_key_errors(params)
    yield from training_errors(params)
    yield from task_errors(params)
    if "+" not in params.task.countdown.ops:  # the one operation that applies at every step of a solution
        yield f"task.countdown.ops: must include '+', got {params.task.countdown.ops!r}"
    for name in RL_SECTIONS:
        yield from _rl_errors(name, getattr(params, name), params)
    for round_name, spec in params.rounds.items():
        if not _ROUND_NAME.fullmatch(str(round_name)):
            yield f"rounds.{round_name}: a round's name may use letters, digits, '_' and '-' only"
        if not _is_model(spec.policy, params.rounds) or spec.policy == f"grpo_final/{round_name}":
            yield (
                f"rounds.{round_name}.policy: not a model trained before the round ({', '.join(MODELS)}, or "
                f"grpo_final/<an earlier round>), got {spec.policy!r}"
            )
    longest = max(params.sft.max_length, params.sft.max_prompt_length + evaluation.max_new_tokens)
    source_problem = None if base.model_path is None else source_error(base.model_path)
    if base.model_path is None:
        yield from _size_errors("base", base, longest)
    elif source_problem is not None:
        yield f"base.model_path: {source_problem}"
    if params.task.chat_template == "always" and source_problem is None and not has_chat_template(base.model_path):
        model = base.model_path or "the built-in tiny model"
        yield f"task.chat_template: 'always' needs a chat template, and the base model ({model}) has none (auto, never)"
    if params.task.system_prompt is not None and source_problem is None:
        if params.task.chat_template == "never":
            yield "task.system_prompt: set, but task.chat_template is 'never': only a chat template puts it in a prompt"
        elif not has_chat_template(base.model_path):
            model = base.model_path or "the built-in tiny model"
            yield f"task.system_prompt: set, but the base model ({model}) has no chat template to put it in"
    agent_base = params.agent_base
    if agent_base.model_path is None:
        episode = params.agent_sft.max_prompt_length + params.agent_eval.max_new_tokens
        yield from _size_errors("agent_base", agent_base, max(params.agent_sft.max_length, episode))
    elif (agent_source_problem := source_error(agent_base.model_path)) is not None:
        yield f"agent_base.model_path: {agent_source_problem}"
    backbone = params.reward_backbone
    yield from _size_errors("reward_backbone", backbone, max(longest, backbone.max_length))
    yield from _reward_model_errors(params)
    if params.best_of_n.n > params.best_of_n.max_n:
        yield f"best_of_n.n: must be <= best_of_n.max_n ({params.best_of_n.max_n}), got {params.best_of_n.n}"
    yield from _distill_errors(params, max(longest, params.sft.max_prompt_length + params.distill.max_new_tokens))
    yield from _user_data_errors(params)
    preference_files = {
        "preferences.train_file": params.preferences.train_file,
        "preferences.test_file": params.preferences.test_file,
    }
    for key, path in preference_files.items():
        if path is None:
            continue
        if not _is_under_user_data(path):
            yield (
                f"{key}: must be under {USER_DATA}/ (the preferences stage depends on that directory, so dvc.lock "
                f"names the file and an edit re-runs what read it), got {path!r}"
            )
        elif not Path(path).is_file():
            yield f"{key}: no file at {path!r}"
    yield from operations_errors(params)


def cross_field_warnings(params: Params) -> Iterator[str]:
    """Values that are legal but do nothing: worth a word, not a refusal."""
    for name in RL_SECTIONS:
        cfg = getattr(params, name)
        if isinstance(cfg, OnlineDPOConfig) and cfg.update == "preference":
            updates = cfg.steps  # a preference iteration takes one optimizer step
        else:
            updates = cfg.steps * cfg.epochs * math.ceil(cfg.rollout_batch_size * cfg.group_size / cfg.minibatch_size)
        if cfg.sync_every > updates:
            yield (
                f"{name}.sync_every: {cfg.sync_every} exceeds the stage's {updates} optimizer steps, so its rollout "
                "engines never take the actor's weights"
            )


def _is_under_user_data(source: str) -> bool:
    literal = Path(*[part for part in Path(source).parts if not _GLOB.search(part)] or ["."])
    return Path(os.path.abspath(literal)).is_relative_to(os.path.abspath(USER_DATA))


def _user_data_errors(params: Params) -> Iterator[str]:
    """Data of your own lives under data/, the data stage's dvc.yaml dependency, so dvc.lock names every shard."""
    sections = [stage_kinds()[kind].section for kind in problem_kinds()]
    sources = {f"{s}.{key}": getattr(getattr(params, s), key) for s in sections for key in ("train_file", "test_file")}
    for key, source in sources.items():
        if source is None:
            continue
        if not _is_under_user_data(source):
            yield f"{key}: must be under {USER_DATA}/ (the data stage depends on that directory), got {source!r}"
        elif not (shards := shard_files(source)):
            yield f"{key}: no JSONL file at {source!r} (a file, a directory of *.jsonl shards, or a glob)"
        else:  # by where a link leads: a link out of data/ is a dependency dvc.lock would not name
            # data/ itself may not be a link either; a shard `dvc add` linked into DVC's cache (cache.type symlink)
            # is versioned where it is
            project = Path.cwd().resolve()
            inside = (project / USER_DATA, project / ".dvc" / "cache")
            for shard in shards:
                if not any(shard.resolve().is_relative_to(directory) for directory in inside):
                    yield f"{key}: {str(shard)!r} is a link to {str(shard.resolve())!r}, outside {USER_DATA}/"
                    break
    quarantine = params.retrain.quarantine
    if quarantine is not None and not _is_under_user_data(quarantine):
        yield f"retrain.quarantine: must be under {USER_DATA}/, got {quarantine!r}"
    elif quarantine is not None:
        for section in sections:  # a quarantined shard leaves every split's reach
            train = getattr(params, section).train_file
            if train is not None and is_shard_of(Path(quarantine, "shard.jsonl"), train):
                yield f"retrain.quarantine: {quarantine!r} is within {section}.train_file's reach ({train!r})"


# Imports a reward function the way the reward process will, from the project directory; run apart so that a
# module that raises, hangs or imports half the world on import cannot take the command line down with it.
_IMPORT_REWARD = """
import importlib, os, sys
sys.path.insert(0, os.getcwd())  # the project first, as tasks/common/project_path.py imports it
module, _, function = sys.argv[1].partition(":")
if not callable(getattr(importlib.import_module(module), function)):
    raise TypeError(f"{sys.argv[1]} is not callable")
"""
_IMPORT_SECONDS = 120


def reward_import_errors(params: Params) -> Iterator[str]:
    """Every reward function of your own (``module:function``) is imported once, in a subprocess, before any work."""
    checked: dict[str, str | None] = {}
    for section in RL_SECTIONS:
        for name in getattr(params, section).rewards:
            if ":" not in name:
                continue
            if name not in checked:
                try:
                    result = subprocess.run(
                        [sys.executable, "-c", _IMPORT_REWARD, name],
                        capture_output=True,
                        text=True,
                        timeout=_IMPORT_SECONDS,
                    )
                    lines = result.stderr.strip().splitlines()
                    checked[name] = (
                        (lines[-1] if lines else f"exit status {result.returncode}") if result.returncode else None
                    )
                except subprocess.TimeoutExpired:
                    checked[name] = f"importing it took over {_IMPORT_SECONDS} s"
            if checked[name] is not None:
                yield f"{section}.rewards.{name}: cannot be imported: {checked[name]}"
