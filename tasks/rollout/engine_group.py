"""The RL stages' rollout engines: one built for a policy (HF or vLLM, by ``rollout_backend``), and the replicas
that run apart from the actor (``rollout_engines`` > 1, or a data-parallel actor), each a copy of the policy on its
own Ray actor that samples its share of a batch's examples (``TaskRollout``) and takes the actor's weights when a
sync is due."""

import dataclasses
from pathlib import Path
from typing import Any, Protocol

import torch
from transformers import PreTrainedModel

from models import load_policy, load_tokenizer, resolve_device
from models.trainable import compute_dtype
from tasks.common.config import Params, RLConfig
from tasks.common.training import make_deterministic, rng_state, set_rng_state
from tasks.data.problems import Example, task_module, task_of
from tasks.data.prompts import PromptFormat
from tasks.rollout.engine import Completion, RolloutEngine, Sampling
from tasks.rollout.episodes import episode_limits, play
from tasks.rollout.hf_engine import params_engine

# Seeds of the engine replicas, apart from the actor's (params.seed) and the critic's (params.seed + 1)
ENGINE_SEED_OFFSET = 1000


def rollout_sampling(cfg: RLConfig) -> Sampling:
    """How a rollout samples: ``group_size`` responses per prompt at the stage's temperature."""
    return Sampling(cfg.max_new_tokens, n=cfg.group_size, temperature=cfg.temperature)


@dataclasses.dataclass(frozen=True)
class TaskRollout:
    """How an RL stage samples a batch of its examples, wherever its engine runs: ``group_size`` episodes of each,
    every model turn sampled with ``max_new_tokens`` at the temperature, within ``params.agent``'s limits (a task
    without tools or an environment: one turn, the response, within the model's context)."""

    sampling: Sampling
    params: Params
    model_dir: Path

    @classmethod
    def of(cls, params: Params, cfg: RLConfig, model_dir: Path) -> "TaskRollout":
        return cls(rollout_sampling(cfg), params, model_dir)

    def sample(self, engine: RolloutEngine, examples: list[Example]) -> list[Completion]:
        """The completions, grouped by example; an episode's carries its turns (``Completion.episode``)."""
        module = task_module(task_of(examples))
        limits = episode_limits(self.params, module, self.model_dir)
        return [episode.completion() for episode in play(engine, examples, module, self.sampling, *limits)]


def make_engine(
    params: Params, cfg: RLConfig, model: PreTrainedModel, tokenizer, model_dir: Path, seed: int
) -> RolloutEngine:
    """The ``rollout_backend`` engine sampling from ``model`` (loaded from ``model_dir``)."""
    if cfg.rollout_backend == "vllm":
        from tasks.rollout.vllm_engine import VLLMEngine  # vllm is optional: imported only when asked for

        dtype = compute_dtype(cfg.precision if cfg.vllm.dtype == "auto" else cfg.vllm.dtype)
        max_length = model.config.max_position_embeddings
        engine = VLLMEngine(model_dir, seed, max_length, PromptFormat.of(params.task), dtype, cfg.vllm)
        engine.sync_weights(model)
        return engine
    return params_engine(params, model, tokenizer)


class EngineWorker:
    """One rollout engine replica apart from the actor: a copy of the policy and its engine (HF or vLLM), which
    samples the share of the prompts it is given and takes the actor's weights when a sync is due."""

    def __init__(self, params: Params, cfg: RLConfig, model_dir: Path, replica: int):
        self.cfg = cfg
        seed = params.seed + ENGINE_SEED_OFFSET + replica  # each replica samples from its own stream
        make_deterministic(seed)
        device, dtype = resolve_device(params.device), compute_dtype(cfg.precision)
        self.model = load_policy(model_dir, device, dtype).requires_grad_(False)
        self.model.eval()
        self.engine = make_engine(params, cfg, self.model, load_tokenizer(model_dir), model_dir, seed)
        self.rollout = TaskRollout.of(params, cfg, model_dir)

    def sample(self, examples: list[Example]) -> list[Completion]:
        return self.rollout.sample(self.engine, examples)

    def load_weights(self, weights: dict[str, torch.Tensor] | None) -> None:
        """Sample from ``weights`` from now on (None: no sync was due; keep sampling as before)."""
        if weights is not None:
            self.model.load_state_dict(weights)
            self.engine.sync_weights(self.model)

    def state(self) -> dict[str, Any]:
        """Its random state, and semi-online its weights (which lag the actor's): what a resumed run needs."""
        weights = None
        if self.cfg.sync_every > 1:
            weights = {name: tensor.detach().cpu().clone() for name, tensor in self.model.state_dict().items()}
        return {"rng": rng_state(), "weights": weights}

    def load_state(self, state: dict[str, Any]) -> None:
        set_rng_state(state["rng"])
        self.load_weights(state["weights"])


class Result(Protocol):
    def result(self) -> Any: ...


class Replica(Protocol):
    """An ``EngineWorker`` where it runs (``tasks/rl/role_handles.py``'s ``Worker``): its methods called by name."""

    def call(self, method: str, *args: Any) -> Result: ...

    def close(self) -> None: ...


class _Generation:
    """The engines' completions of one batch, each replica's share put back in prompt order."""

    def __init__(self, calls: list[tuple[int, Result]]):
        self.calls = calls  # (index of the share's first prompt, the replica's call)

    def result(self) -> list[Completion]:
        return [
            dataclasses.replace(completion, prompt_index=start + completion.prompt_index, engine=replica)
            for replica, (start, call) in enumerate(self.calls)
            for completion in call.result()
        ]


class _Each:
    """A call on every replica: its result is each one's."""

    def __init__(self, calls: list[Result]):
        self.calls = calls

    def result(self) -> list[Any]:
        return [call.result() for call in self.calls]


class EngineGroup:
    """The rollout engine replicas apart from the actor: replica i samples the i-th contiguous share of a batch's
    examples (``TaskRollout``); after an actor update that makes a sync due, every replica loads the actor's
    weights, handed over through Ray's object store (put once, read by each). Each method returns at once;
    ``result()`` waits."""

    apart = True  # from the actor: they take its weights after its updates

    def __init__(self, replicas: list[Replica]):
        self.replicas = replicas

    def sample(self, examples: list[Example]) -> Result:
        """Each replica samples its contiguous share of ``examples``; the completions put back in their order."""
        sizes = [len(share) for share in torch.arange(len(examples)).tensor_split(len(self.replicas))]
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return _Generation(
            [
                (start, replica.call(EngineWorker.sample.__name__, examples[start : start + size]))
                for replica, start, size in zip(self.replicas, starts, sizes, strict=True)
            ]
        )

    def load_weights(self, weights: Any) -> Result:
        """``weights`` (a dict, a Ray object holding one, or None when no sync was due) into every replica."""
        import ray  # the replicas run on Ray actors: the engine modules load without it

        shared = weights if weights is None or isinstance(weights, ray.ObjectRef) else ray.put(weights)
        return _Each([replica.call(EngineWorker.load_weights.__name__, shared) for replica in self.replicas])

    def state(self) -> Result:
        return _Each([replica.call(EngineWorker.state.__name__) for replica in self.replicas])

    def load_state(self, states: list[dict[str, Any]]) -> Result:
        shares = zip(self.replicas, states, strict=True)
        return _Each([replica.call(EngineWorker.load_state.__name__, state) for replica, state in shares])

    def close(self) -> None:
        for replica in self.replicas:
            replica.close()
