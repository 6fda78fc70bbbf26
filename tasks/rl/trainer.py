"""The RL trainer every RL stage runs (PPO, GRPO and their kin): what runs is chosen by params, not by code paths.

One iteration, top to bottom:

1. roll out: the actor samples ``group_size`` responses for each of ``rollout_batch_size`` prompts;
2. score: every reward function (rule-based verifiers, your own, the reward model) scores every
   response and their weighted sum is the response's score (normalised and clipped if asked).
   With dynamic sampling, groups whose scores are all equal teach nothing and are dropped, and
   more prompts are rolled out until the batch is full or ``max_sampling_rounds`` is reached;
3. log-probs: the actor's (π_old) of every sampled token (with one update per rollout, the update's
   own forward pass gives them instead), the reference's when a KL term needs it, the critic's values
   when the advantage estimator needs a critic;
4. advantages: per-token rewards (the score at the last token, and −β·log π/π_ref at every token
   when the KL is in the reward) go through the ``advantage`` estimator;
5. update: ``epochs`` passes of minibatches of ``policy_loss`` (plus β·KL when the KL is a loss);
   the critic regresses on its returns;
6. control: β follows the adaptive KL controller toward ``kl_target`` (or stays fixed); every
   ``ref_reset_every`` iterations the reference becomes the current policy.

Steps 3-5 are the policy-gradient ``Learner``; a stage may hand ``train`` another (``online_dpo``'s
preference update, ``tasks/rl/online_preference.py``; ``distill``'s, ``tasks/rl/distillation.py``, with a frozen
teacher as one more role), which reuses the rollout, scoring, monitoring and checkpoints; a learner may also
take some iterations' responses from a dataset instead of the policy (GKD's teacher batches). With
``heldout_every``, the policy is also sampled on a fixed held-out slice before the first iteration and every
``heldout_every`` after (``heldout/gold_reward``; ``dip`` and ``recovery_iterations``).

The gold judge (hidden from training) scores every rollout too, so reward hacking shows as the
reward rising while the gold reward falls. A checkpoint every ``save_every`` iterations holds the
trained models and optimizers, the reference when it has been reset, β, reward statistics, RNG,
the prompt cursor and the metric history.
"""

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from models import context_length, load_tokenizer, num_parameters
from tasks.common.artifacts import DATA_DIR, atomic_output, model_dir
from tasks.common.config import Params, RLConfig, stage_kinds, to_dict
from tasks.common.errors import NonFiniteError, cause
from tasks.common.flops import mfu
from tasks.common.tracking import log_step, stage_live, write_perf
from tasks.common.training import (
    Checkpointer,
    Throughput,
    epoch_batch,
    make_deterministic,
    rng_state,
    set_rng_state,
    stop_on_divergence,
)
from tasks.data.datasets import check_prompt_lengths, read_examples
from tasks.data.judge import gold_utility
from tasks.data.problems import Example, score_response
from tasks.rl.core_algos import (
    ADVANTAGE_ESTIMATORS,
    adaptive_kl_coef,
    explained_variance,
    informative_groups,
    kl_k1,
    masked_mean,
    shaped_rewards,
)
from tasks.rl.rewards import REWARD_MODEL, RewardInputs, RewardScorer
from tasks.rl.sequences import PackedBatch, pack
from tasks.rl.workers import Worker, placed, updates_per_rollout
from tasks.rollout.engine import Completion, Sampling

# Rewards beyond this are a bug in a reward function, not a signal: normalising them would overflow.
REWARD_LIMIT = 1e6
HACKING_WINDOW = 10  # iterations compared when looking for reward up while gold reward goes down
HELDOUT = "heldout/gold_reward"  # the policy's gold reward on a fixed held-out slice, every heldout_every iterations


@dataclass
class RunningMoments:
    """Mean and variance of every score seen so far (Chan et al.'s parallel update)."""

    count: float = 0.0
    mean: float = 0.0
    var: float = 1.0

    def update(self, values: torch.Tensor) -> None:
        batch_mean, batch_var, n = values.mean().item(), values.var(unbiased=False).item(), len(values)
        total = self.count + n
        delta = batch_mean - self.mean
        self.var = (self.count * self.var + n * batch_var + delta**2 * self.count * n / total) / total
        self.mean += delta * n / total
        self.count = total

    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        return (values - self.mean) / math.sqrt(self.var + 1e-8)


@dataclass
class LoopState:
    """What a resumed run needs besides the models: where it is, and what it has learned about its rewards."""

    step: int = 0
    cursor: int = 0  # prompt batches drawn so far (dynamic sampling draws more than one per iteration)
    kl_coef: float = 0.0
    moments: RunningMoments = field(default_factory=RunningMoments)
    history: list[tuple[int, dict[str, float]]] = field(default_factory=list)


@dataclass
class Rollout:
    """Scored responses, ``group_size`` consecutive ones per prompt."""

    examples: list[Example]  # the problem of each response
    completions: list[Completion]
    scores: torch.Tensor  # (N,) the weighted sum of the reward functions
    components: dict[str, torch.Tensor]  # (N,) each reward function's own reward
    failures: dict[str, int]
    on_policy: bool = True  # False: responses taken from a dataset (a teacher's), not sampled from the policy

    def packed(self, tokenizer, rows: list[int] | None = None) -> PackedBatch:
        """The responses of ``rows`` (all by default) packed after their prompts, each distinct prompt tokenised
        once (a group's responses share theirs)."""
        rows = range(len(self.completions)) if rows is None else rows
        prompt_ids = self._prompt_ids(tokenizer)
        responses = [self.completions[row].token_ids for row in rows]
        return pack([prompt_ids[self.examples[row].prompt] for row in rows], responses, tokenizer.pad_token_id)

    def tokens(self, tokenizer) -> int:
        """Real tokens of every row: its prompt's and its response's (what a training pass over it computes)."""
        prompt_ids = self._prompt_ids(tokenizer)
        return sum(
            len(prompt_ids[e.prompt]) + len(c.token_ids) for e, c in zip(self.examples, self.completions, strict=True)
        )

    def _prompt_ids(self, tokenizer) -> dict[str, list[int]]:
        """Each distinct prompt's token ids (a group's responses share theirs)."""
        distinct = list(dict.fromkeys(example.prompt for example in self.examples))
        return dict(zip(distinct, tokenizer(distinct)["input_ids"], strict=True))

    def groups(self, keep: torch.Tensor, group_size: int) -> "Rollout":
        rows = torch.arange(len(self.scores)).view(-1, group_size)[keep].flatten().tolist()
        return Rollout(
            [self.examples[i] for i in rows],
            [self.completions[i] for i in rows],
            self.scores[rows],
            {name: values[rows] for name, values in self.components.items()},
            self.failures,
        )

    @staticmethod
    def join(parts: list["Rollout"]) -> "Rollout":
        failures: dict[str, int] = {}
        for part in parts:
            for name, count in part.failures.items():
                failures[name] = failures.get(name, 0) + count
        return Rollout(
            [e for part in parts for e in part.examples],
            [c for part in parts for c in part.completions],
            torch.cat([part.scores for part in parts]),
            {name: torch.cat([part.components[name] for part in parts]) for name in parts[0].components},
            failures,
        )


@dataclass(frozen=True)
class Learner:
    """What an iteration's scored rollout trains, and the roles besides the actor that it needs: the stage picks
    one (``policy_gradient`` below, or the online preference update of ``tasks/rl/online_preference.py``)."""

    roles: Callable[[RLConfig], set[str]]
    learn: Callable[..., dict[str, float]]  # (roles, rollout, tokenizer, cfg, state, clock) -> metrics
    # The responses of iteration i when they do not come from the policy (GKD's teacher batches): a Rollout, or
    # None to sample as usual.
    offline: Callable[[int], Rollout | None] | None = None
    inputs: tuple[Path, ...] = ()  # files it reads besides the policy and the prompts: a resume must see the same


def reward_roles(cfg: RLConfig) -> set[str]:
    """The reward model's role, when the rewards weigh it."""
    return {"reward"} if cfg.rewards.get(REWARD_MODEL, 0.0) else set()


def needed_roles(cfg: RLConfig) -> set[str]:
    """The roles besides the actor that this configuration uses."""
    roles = set()
    if ADVANTAGE_ESTIMATORS[cfg.advantage].needs_critic:
        roles.add("critic")
    if cfg.kl_in_reward or cfg.kl_loss != "none" or cfg.ref_reset_every:
        roles.add("reference")
    return roles | reward_roles(cfg)


def prepare_scores(raw: torch.Tensor, cfg: RLConfig, moments: RunningMoments) -> torch.Tensor:
    scores = raw
    if cfg.reward_normalize:
        moments.update(raw)
        scores = moments.normalize(raw)
    if cfg.reward_clip is not None:
        scores = scores.clamp(-cfg.reward_clip, cfg.reward_clip)
    return scores


def score(
    roles: dict[str, Worker], scorer: RewardScorer, examples: list[Example], cfg: RLConfig, clock: dict[str, float]
) -> Rollout:
    """Roll out ``group_size`` responses per example and score them with every reward function."""
    started = time.perf_counter()
    completions = roles["rollout"].call("generate", [e.prompt for e in examples]).result()
    generated = time.perf_counter()
    per_response = [examples[c.prompt_index] for c in completions]
    texts = [c.text for c in completions]
    pending = None
    if "reward" in roles:
        pending = roles["reward"].call("score", [e.prompt for e in per_response], texts)
    inputs = RewardInputs(
        per_response,
        texts,
        [len(c.token_ids) for c in completions],
        [c.truncated for c in completions],
        cfg.max_new_tokens,
        cfg.overlong_buffer,
    )
    total, components, failures = scorer.score(inputs)
    if pending is not None:
        components[REWARD_MODEL] = pending.result()
        total = total + cfg.rewards[REWARD_MODEL] * components[REWARD_MODEL]
    check_rewards(total, components)
    clock["time/generate"] += generated - started
    clock["time/score"] += time.perf_counter() - generated
    return Rollout(per_response, completions, total, components, failures)


def check_rewards(total: torch.Tensor, components: dict[str, torch.Tensor]) -> None:
    """Stop before an advantage sees a reward that is not finite or beyond ``REWARD_LIMIT``, naming its source."""
    for name, values in {**components, "the weighted sum": total}.items():
        bad = ~torch.isfinite(values) | (values.abs() > REWARD_LIMIT)
        if bad.any():
            row = int(bad.nonzero()[0])
            raise NonFiniteError(
                f"reward {name!r} is {values[row].item()} for response {row}, outside +-{REWARD_LIMIT:g}"
            )


def collect(
    roles: dict[str, Worker],
    scorer: RewardScorer,
    examples: list[Example],
    cfg: RLConfig,
    state: LoopState,
    seed: int,
    clock: dict[str, float],
) -> tuple[Rollout | None, dict[str, float]]:
    """One iteration's rollout: a batch of prompts, refilled while dynamic sampling drops uninformative groups."""
    kept: list[Rollout] = []
    groups_kept, rounds, zero_variance = 0, 0, []
    while rounds < cfg.max_sampling_rounds:
        batch = [examples[i] for i in epoch_batch(len(examples), cfg.rollout_batch_size, state.cursor, seed)]
        state.cursor += 1
        rounds += 1
        rollout = score(roles, scorer, batch, cfg, clock)
        informative = informative_groups(rollout.scores, cfg.group_size)
        zero_variance.append(1.0 - informative.float().mean().item())
        if not cfg.dynamic_sampling:
            kept, groups_kept = [rollout], len(batch)
            break
        kept.append(rollout.groups(informative, cfg.group_size))
        groups_kept += int(informative.sum())
        if groups_kept >= cfg.rollout_batch_size:
            break
    stats = {}
    if cfg.group_size > 1:
        stats = {"zero_variance_groups": sum(zero_variance) / len(zero_variance), "sampling_rounds": rounds}
    if groups_kept == 0:
        return None, stats
    rollout = Rollout.join(kept)
    if groups_kept > cfg.rollout_batch_size:
        rollout = rollout.groups(torch.arange(groups_kept) < cfg.rollout_batch_size, cfg.group_size)
    return rollout, stats


def learn(
    roles: dict[str, Worker], rollout: Rollout, tokenizer, cfg: RLConfig, state: LoopState, clock: dict[str, float]
) -> dict[str, float]:
    """Advantages and updates on one scored rollout; returns the iteration's training metrics."""
    started = time.perf_counter()
    batch = rollout.packed(tokenizer)
    mask = batch.response_mask
    engine_logprobs = sampled_logprobs(rollout.completions, mask)
    # One update per rollout: π_old is the actor as it is, and the update's own forward pass gives its
    # log-probs; a pass beforehand would compute the same numbers (unless the KL is in the reward, which
    # needs them before the advantages). Semi-online, the engine sampled with older weights: π_old is that
    # policy, whose log-probs the engine reported, and the actor's own pass measures parity and KL.
    semi_online = cfg.sync_every > 1
    single_update = updates_per_rollout(len(mask), cfg) == 1 and not cfg.kl_in_reward and not semi_online
    pending = {
        name: roles[role].call(method, batch)
        for name, role, method in _PASSES
        if role in roles and not (single_update and name == "logprobs")
    }
    out = {name: call.result() for name, call in pending.items()}
    current_logprobs = out.get("logprobs")
    old_logprobs = engine_logprobs if semi_online else current_logprobs
    ref_logprobs, values = out.get("ref_logprobs"), out.get("values")
    passed = time.perf_counter()
    clock["time/score"] += passed - started

    scores = prepare_scores(rollout.scores, cfg, state.moments)
    kl_penalty = state.kl_coef * kl_k1(old_logprobs, ref_logprobs) if cfg.kl_in_reward else None
    token_rewards = shaped_rewards(scores, mask, kl_penalty)
    advantages, returns = ADVANTAGE_ESTIMATORS[cfg.advantage](
        token_rewards, mask, cfg.group_size, values=values, gamma=cfg.gamma, lam=cfg.lam
    )
    actor_update = roles["actor"].call("update", batch, old_logprobs, advantages, ref_logprobs, state.kl_coef)
    critic_update = roles["critic"].call("update", batch, values, returns) if "critic" in roles else None
    metrics, old_logprobs = actor_update.result()
    if critic_update is not None:
        metrics |= critic_update.result()
    clock["time/train"] += time.perf_counter() - passed

    trainer_logprobs = current_logprobs if semi_online else old_logprobs
    engines = [c.engine for c in rollout.completions]
    metrics |= policy_metrics(engine_logprobs, trainer_logprobs, ref_logprobs, mask, engines)
    if ref_logprobs is not None:
        metrics["kl_coef"] = state.kl_coef
    if values is not None:
        metrics["explained_variance"] = explained_variance(values, returns, mask).item()
    return metrics


POLICY_GRADIENT = Learner(needed_roles, learn)


def sampled_logprobs(completions: list[Completion], mask: torch.Tensor) -> torch.Tensor:
    """(B, T): the log-prob the rollout engine sampled each response token with."""
    logprobs = torch.zeros_like(mask)
    for row, completion in enumerate(completions):
        logprobs[row, : len(completion.logprobs)] = torch.tensor(completion.logprobs)
    return logprobs


def policy_metrics(
    engine_logprobs: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    mask: torch.Tensor,
    engines: list[int] | None = None,
) -> dict[str, float]:
    """Parity (the engine's log-probs against the trainer's, per token; semi-online this includes the policy's
    drift since the engine's last sync), response length, and the KL to the reference per response. ``engines``:
    the replica that sampled each row; with more than one, each replica's parity too (``logprob_parity_engine_i``)."""
    gap = (engine_logprobs - logprobs).abs()
    metrics = {"logprob_parity": masked_mean(gap, mask).item(), "response_length": mask.sum(-1).mean().item()}
    replicas = torch.tensor(engines or [0] * len(mask))
    if len(replicas.unique()) > 1:
        for replica in replicas.unique().tolist():
            rows = replicas == replica
            metrics[f"logprob_parity_engine_{replica}"] = masked_mean(gap[rows], mask[rows]).item()
    if ref_logprobs is not None:
        metrics["kl"] = (kl_k1(logprobs, ref_logprobs) * mask).sum(-1).mean().item()
    return metrics


# (output name, role, method) of the passes over a packed rollout, run concurrently across roles
_PASSES = (("logprobs", "actor", "logprobs"), ("ref_logprobs", "reference", "logprobs"), ("values", "critic", "values"))


def rollout_metrics(rollout: Rollout) -> dict[str, float]:
    gold = [gold_utility(e, c.text) for e, c in zip(rollout.examples, rollout.completions, strict=True)]
    correct = [score_response(e, c.text)[1] for e, c in zip(rollout.examples, rollout.completions, strict=True)]
    return {
        "reward": rollout.scores.mean().item(),
        **{f"rewards/{name}": values.mean().item() for name, values in rollout.components.items()},
        **{name: float(count) for name, count in rollout.failures.items()},
        "gold_reward": sum(gold) / len(gold),
        "accuracy": sum(correct) / len(correct),
    }


def alarms(history: list[tuple[int, dict[str, float]]], cfg: RLConfig) -> list[str]:
    """What looks wrong at the latest iteration: KL running away, entropy collapsing, reward hacking."""
    latest = history[-1][1]
    found = []
    if latest.get("kl", 0.0) > cfg.kl_budget:
        found.append(f"KL to the reference {latest['kl']:.2f} is over kl_budget={cfg.kl_budget}")
    if latest.get("entropy", cfg.entropy_floor) < cfg.entropy_floor:  # an update that had no pairs logs none
        found.append(f"entropy {latest['entropy']:.3f} collapsed below entropy_floor={cfg.entropy_floor}")
    if len(history) >= 2 * HACKING_WINDOW:
        recent, before = history[-HACKING_WINDOW:], history[-2 * HACKING_WINDOW : -HACKING_WINDOW]

        def change(name: str) -> float:
            def mean(window):
                values = [m[name] for _, m in window if name in m]  # an iteration that taught nothing has none
                return sum(values) / max(1, len(values))

            return mean(recent) - mean(before)

        if change("reward") > 0 and change("gold_reward") < -0.02:
            found.append(
                f"reward hacking? over the last {HACKING_WINDOW} iterations the reward moved "
                f"{change('reward'):+.3f} while the gold reward moved {change('gold_reward'):+.3f}"
            )
    return found


def heldout_gold_reward(roles: dict[str, Worker], examples: list[Example], cfg: RLConfig, seed: int) -> float:
    """The current policy's mean gold reward on ``examples``, sampled as the rollouts are, from its own ``seed``
    (the probe leaves the run's random streams, and so its training, as they were)."""
    sampling = Sampling(cfg.max_new_tokens, n=cfg.group_size, temperature=cfg.temperature)
    completions = roles["actor"].call("sample_current", [e.prompt for e in examples], sampling, seed).result()
    return float(f"{sum(gold_utility(examples[c.prompt_index], c.text) for c in completions) / len(completions):.6g}")


def dip_and_recovery(history: list[tuple[int, dict[str, float]]]) -> tuple[float, int | None]:
    """From the held-out gold rewards in ``history`` (the first, at iteration 0, is the starting policy's): the
    largest fall below the start before the policy first comes back to it, and the iteration it does (0 when it
    never fell; None when it has not come back yet)."""
    probes = [(step, metrics[HELDOUT]) for step, metrics in history if HELDOUT in metrics]
    start, dip = probes[0][1], 0.0
    for step, value in probes[1:]:
        if value >= start and dip > 0:
            return dip, step
        dip = max(dip, start - value)
    return dip, (0 if dip == 0 else None)


def train(
    params: Params,
    cfg: RLConfig,
    stage: str,
    init_dir: Path,
    train_file: Path,
    reward_dirs: list[Path],
    learner: Learner = POLICY_GRADIENT,
    teacher_dir: Path | None = None,
) -> None:
    """RL on the prompts of ``train_file`` from the policy in ``init_dir``, each scored rollout trained by
    ``learner`` (with the frozen ``teacher_dir`` as a role, for distillation); the policy is written to the
    stage's dir."""
    make_deterministic(params.seed)
    examples = read_examples(train_file)
    section = stage_kinds()[stage.partition("@")[0]][1]
    tokenizer = load_tokenizer(init_dir)
    check_prompt_lengths(
        examples,
        tokenizer,
        train_file,
        params.sft.max_prompt_length,
        context_length(init_dir),
        (f"{section}.max_new_tokens", cfg.max_new_tokens),
    )
    if len(examples) < cfg.rollout_batch_size:
        raise ValueError(f"{stage}: {len(examples)} training prompts, fewer than rollout_batch_size")
    wanted = learner.roles(cfg)
    if "reward" in wanted and not reward_dirs:
        raise ValueError(
            f"{stage}: rewards.{REWARD_MODEL} needs a reward model (run `alignflow stage reward_model` first)"
        )
    scorer = RewardScorer(cfg.rewards, cfg.reward_timeout_seconds, cfg.reward_failure_warning)
    config = {"stage": stage, "seed": params.seed, "device": params.device, **to_dict(cfg)}
    teacher = [teacher_dir] if teacher_dir is not None else []
    checkpointer = Checkpointer(stage, config, [init_dir, train_file, *reward_dirs, *teacher, *learner.inputs])
    with (
        placed(params, cfg, init_dir, reward_dirs, wanted, teacher_dir, section) as roles,
        scorer,
        atomic_output(model_dir(stage)) as out,
        stage_live(stage) as live,
        stop_on_divergence(checkpointer),
    ):
        state, reference_reset = _resume(roles, checkpointer, cfg)
        for logged_step, metrics in state.history:
            log_step(live, logged_step, metrics)
        heldout = read_examples(DATA_DIR / "test.jsonl")[: cfg.heldout_prompts] if cfg.heldout_every else []
        if heldout and state.step == 0:
            state.history.append((0, {HELDOUT: heldout_gold_reward(roles, heldout, cfg, params.seed)}))
            log_step(live, 0, state.history[-1][1])
        progress = tqdm(range(state.step, cfg.steps), desc=stage, initial=state.step, total=cfg.steps)
        parameters, updates = num_parameters(init_dir), Throughput()
        workers = cfg.parallel.num_workers
        threads = cfg.parallel.threads_per_worker if workers > 1 else torch.get_num_threads()
        raised: set[str] = set()
        for step in progress:
            started = time.perf_counter()
            clock = dict.fromkeys(("time/generate", "time/score", "time/train"), 0.0)
            try:
                rollout, metrics = learner.offline(step) if learner.offline else None, {}
                if rollout is None:
                    rollout, metrics = collect(roles, scorer, examples, cfg, state, params.seed, clock)
                if rollout is not None:
                    metrics |= rollout_metrics(rollout) if rollout.on_policy else {"offline_batch": 1.0}
                    metrics |= learner.learn(roles, rollout, tokenizer, cfg, state, clock)
                    if engines_apart(roles):  # a sync, when one is due, hands the actor's weights to the engines
                        roles["rollout"].call("load_weights", roles["actor"].call("weights_for_engines").ref())
                if heldout and ((step + 1) % cfg.heldout_every == 0 or step + 1 == cfg.steps):
                    metrics[HELDOUT] = heldout_gold_reward(roles, heldout, cfg, params.seed + step + 1)
            except NonFiniteError as error:  # raised by a role (maybe on a Ray actor) that does not know the step
                raise NonFiniteError(f"{stage} step {step + 1}: {cause(error)}") from None
            if cfg.kl_target is not None and "kl" in metrics:
                state.kl_coef = adaptive_kl_coef(
                    state.kl_coef, metrics["kl"], cfg.kl_target, cfg.kl_horizon, len(rollout.scores)
                )
            state.step = step + 1
            if cfg.ref_reset_every and state.step % cfg.ref_reset_every == 0:
                reference_reset = roles["actor"].call("weights").result()
                roles["reference"].call("load_weights", reference_reset).result()
            # Wall-clock times vary run to run: log them, but keep them out of the resumable history.
            logged = {name: float(f"{value:.6g}") for name, value in metrics.items()}
            state.history.append((state.step, logged))
            log_step(live, state.step, logged)
            # the phases and the bookkeeping around them; alarms and checkpoints come after
            clock["time/step"] = time.perf_counter() - started
            log_step(live, state.step, {name: round(seconds, 4) for name, seconds in clock.items()}, prefix="")
            if rollout is not None and clock["time/train"] > 0:
                # the update's model FLOPs utilisation: its passes over the rollout's real tokens, epochs times
                trained = rollout.tokens(tokenizer) * cfg.epochs
                updates.add(trained, clock["time/train"])
                latest = mfu(parameters, trained, clock["time/train"], threads, workers)
                log_step(live, state.step, {"perf/update_mfu": round(latest, 4)}, prefix="")
            progress.set_postfix(reward=logged.get("reward"), gold=logged.get("gold_reward"))
            if rollout is not None:
                for alarm in alarms(state.history, cfg):
                    if alarm.split()[0] not in raised:
                        progress.write(f"WARNING {stage} step {state.step}: {alarm}")
                    raised.add(alarm.split()[0])
            if state.step % cfg.save_every == 0 and state.step < cfg.steps:
                checkpointer.save(_checkpoint(roles, state, reference_reset))
        final = _latest(state.history)
        for name in ("reward", "gold_reward", "accuracy", "kl", "kl_coef", "entropy", "divergence"):
            if name in final:
                live.summary[name] = final[name]
        live.summary["kl_budget"] = cfg.kl_budget
        if heldout:
            live.summary["dip"], live.summary["recovery_iterations"] = dip_and_recovery(state.history)
        live.make_summary()
        if updates.seconds:
            numbers = updates.numbers(parameters, threads, workers)
            renamed = {"tokens_per_second": "update_tokens_per_second", "mfu": "update_mfu"}
            write_perf(live, {renamed.get(name, name): value for name, value in numbers.items()})
        roles["actor"].call("save", out, init_dir).result()
    checkpointer.clear()


def _resume(roles: dict[str, Worker], checkpointer: Checkpointer, cfg: RLConfig) -> tuple[LoopState, dict | None]:
    """The loop's state, and the reference's weights when it has been reset: fresh, or from the checkpoint, whose
    models, optimisers and random states are loaded into the roles."""
    if (checkpoint := checkpointer.load()) is None:
        return LoopState(kl_coef=cfg.kl_coef), None
    for role in ("actor", "critic"):
        if role in roles:
            roles[role].call("load_state", checkpoint[role]).result()
    if engines_apart(roles):
        roles["rollout"].call("load_state", checkpoint["engines"]).result()
        if cfg.sync_every == 1:  # the engines sample from the policy as it is
            roles["rollout"].call("load_weights", roles["actor"].call("weights").ref()).result()
    if checkpoint["reference"] is not None:
        roles["reference"].call("load_weights", checkpoint["reference"]).result()
    set_rng_state(checkpoint["rng"])
    moments = RunningMoments(**checkpoint["state"]["moments"])
    return LoopState(**{**checkpoint["state"], "moments": moments}), checkpoint["reference"]


def _latest(history: list[tuple[int, dict[str, float]]]) -> dict[str, float]:
    """The last value of every metric (an iteration whose rollout taught nothing logs only sampling stats)."""
    latest: dict[str, float] = {}
    for _, metrics in history:
        latest.update(metrics)
    return latest


def engines_apart(roles: dict[str, Worker]) -> bool:
    """Whether the rollout engines run apart from the actor (and take its weights after its updates)."""
    return roles["rollout"] is not roles["actor"]


def _checkpoint(roles: dict[str, Worker], state: LoopState, reference: dict | None) -> dict[str, Any]:
    return {
        **{role: roles[role].call("state").result() for role in ("actor", "critic") if role in roles},
        "engines": roles["rollout"].call("state").result() if engines_apart(roles) else None,
        "reference": reference,
        "rng": rng_state(),
        "state": asdict(state),
        "step": state.step,
    }
