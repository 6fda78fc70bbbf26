"""The RL trainer every RL stage runs (PPO, GRPO and their kin): what runs is chosen by params, not by code paths.

One iteration, top to bottom:

1. roll out: the actor samples ``group_size`` responses for each of ``rollout_batch_size`` prompts (of a task with
   tools or an environment, plays ``group_size`` episodes of each, ``params.agent``'s limits: a response is then
   the episode's every model turn and observation, trained on the model's tokens only, graded on its final turn);
2. score: every reward function (rule-based verifiers, your own, the reward model) scores every
   response and their weighted sum is the response's score (normalised and clipped if asked).
   With dynamic sampling, groups whose scores are all equal teach nothing and are dropped, and
   more prompts are rolled out until the batch is full or ``max_sampling_rounds`` is reached;
3. log-probs: the actor's (π_old) of every sampled token (with one update per rollout, the update's
   own forward pass gives them instead), the reference's when a KL term needs it, the critic's values
   when the advantage estimator needs a critic;
4. advantages: per-token rewards (the score at the last token, and −β·log π/π_ref at every token
   when the KL is in the reward) go through the ``advantage`` estimator;
5. update: ``epochs`` passes of minibatches of ``policy_loss`` reduced by ``loss_agg_mode`` (plus β·KL when
   the KL is a loss); the critic regresses on its returns;
6. control: β follows the adaptive KL controller toward ``kl_target`` (or stays fixed); every
   ``ref_reset_every`` iterations the reference becomes the current policy.

Steps 3-5 are the policy-gradient ``Learner`` (``tasks/rl/policy_gradient.py``; what a learner is:
``tasks/rl/learner.py``); a stage may hand ``train`` another (``online_dpo``'s preference update,
``tasks/rl/online_preference.py``; ``distill``'s, ``tasks/rl/distillation.py``, with a frozen teacher as one more
role), which reuses the rollout, scoring, monitoring and checkpoints; a learner may also take some iterations'
responses from a dataset instead of the policy (GKD's teacher batches). With ``heldout_every``, the policy is also
sampled on a fixed held-out slice before the first iteration and every ``heldout_every`` after
(``heldout/gold_reward``; ``dip`` and ``recovery_iterations``).

The gold judge (hidden from training) scores every rollout too, so reward hacking shows as the
reward rising while the gold reward falls. A checkpoint every ``save_every`` iterations holds the
trained models and optimizers, the reference when it has been reset, β, reward statistics, RNG,
the prompt cursor and the metric history.
"""

import json
import time
from dataclasses import asdict
from operator import attrgetter
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from models import context_length, load_tokenizer, num_parameters
from tasks.common.artifacts import EPISODES_FILE, atomic_output, judge_dir, model_dir
from tasks.common.config import Params, RLConfig, to_dict
from tasks.common.errors import NonFiniteError, cause
from tasks.common.flops import mfu
from tasks.common.tracking import log_step, stage_live, write_perf
from tasks.common.training import (
    Checkpointer,
    Throughput,
    make_deterministic,
    rng_state,
    set_rng_state,
    stop_on_divergence,
)
from tasks.data.datasets import check_prompt_lengths, read_examples
from tasks.data.environments import check_tool_tags
from tasks.data.judge import gold_utility
from tasks.data.problems import Example, score_response, task_module, task_of
from tasks.data.prompts import PromptFormat
from tasks.kinds import prompt_limit_key, stage_kinds
from tasks.rl.async_rollouts import RolloutsAhead, Sampled, draw, sample
from tasks.rl.core_algos import adaptive_kl_coef, informative_groups
from tasks.rl.gold_vs_proxy import peak, rl_curve, write_curve
from tasks.rl.guard import Guard, guard_signal, probe_split
from tasks.rl.learner import Learner, LoopState, Rollout, RunningMoments
from tasks.rl.placement import placed
from tasks.rl.policy_gradient import POLICY_GRADIENT
from tasks.rl.rewards import REWARD_MODEL, RewardInputs, RewardScorer
from tasks.rl.role_handles import Roles
from tasks.rollout.engine import Completion, Sampling, truncated_rate

# Rewards beyond this are a bug in a reward function, not a signal: normalising them would overflow.
REWARD_LIMIT = 1e6
HACKING_WINDOW = 10  # iterations compared when looking for reward up while gold reward goes down
SIGNAL_WINDOW = 5  # iterations without a right sample, or without a group whose rewards differ, before a warning
HELDOUT = "heldout/gold_reward"  # the policy's gold reward on a fixed held-out slice, every heldout_every iterations


def score(roles: Roles, scorer: RewardScorer, sampled: Sampled, cfg: RLConfig, clock: dict[str, float]) -> Rollout:
    """Wait for the ``group_size`` responses (or episodes) ``sampled`` per example and score them with every reward
    function."""
    started = time.perf_counter()
    completions = sampled.result()
    generated = time.perf_counter()
    per_response = [sampled.examples[c.prompt_index] for c in completions]
    texts = [c.text for c in completions]
    pending = None
    if roles.reward:
        pending = roles.reward.score([e.prompt for e in per_response], completions)
    inputs = RewardInputs(
        per_response,
        texts,
        [c.model_tokens for c in completions],
        [c.truncated for c in completions],
        cfg.max_new_tokens,
        cfg.overlong_buffer,
        [c.episode.env_reward for c in completions] if completions and completions[0].episode else None,
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
    roles: Roles,
    scorer: RewardScorer,
    examples: list[Example],
    cfg: RLConfig,
    state: LoopState,
    seed: int,
    clock: dict[str, float],
    ahead: RolloutsAhead | None = None,
) -> tuple[Rollout | None, dict[str, float]]:
    """One iteration's rollout: a batch of prompts, refilled while dynamic sampling drops uninformative groups.
    With asynchronous rollouts (``ahead``), its first batch may have been handed out iterations ago, and the next
    iterations' go out before this one's is scored."""
    kept: list[Rollout] = []
    groups_kept, rounds, zero_variance, stats = 0, 0, [], {}
    while rounds < cfg.max_sampling_rounds:
        sampled = ahead.take(state.step) if ahead is not None and rounds == 0 else None
        if sampled is None:
            started = time.perf_counter()  # an engine in the actor's process samples before returning
            sampled = sample(roles, draw(examples, cfg, state, seed), state.step)
            clock["time/generate"] += time.perf_counter() - started
        if ahead is not None and rounds == 0:
            ahead.hand_out(state.step, state)
            stats["staleness"] = state.step - sampled.handed_out  # iterations the sampling weights lag the actor's
        rounds += 1
        rollout = score(roles, scorer, sampled, cfg, clock)
        state.episodes += episode_rows(rollout, state.step + 1)  # every one played, a group dropped below or not
        informative = informative_groups(rollout.scores, cfg.group_size)
        zero_variance.append(1.0 - informative.float().mean().item())
        if not cfg.dynamic_sampling:
            kept, groups_kept = [rollout], len(sampled.examples)
            break
        kept.append(rollout.groups(informative, cfg.group_size))
        groups_kept += int(informative.sum())
        if groups_kept >= cfg.rollout_batch_size:
            break
    if cfg.group_size > 1:
        stats |= {"zero_variance_groups": sum(zero_variance) / len(zero_variance), "sampling_rounds": rounds}
    if groups_kept == 0:
        return None, stats
    rollout = Rollout.join(kept)
    if groups_kept > cfg.rollout_batch_size:
        rollout = rollout.groups(torch.arange(groups_kept) < cfg.rollout_batch_size, cfg.group_size)
    return rollout, stats


def rollout_metrics(rollout: Rollout) -> dict[str, float]:
    pairs = list(zip(rollout.examples, rollout.completions, strict=True))
    gold = [gold_utility(e, c.text, c.env_reward) for e, c in pairs]
    correct = [score_response(e, c.text, c.env_reward)[1] for e, c in pairs]
    return {
        "reward": rollout.scores.mean().item(),
        **{f"rewards/{name}": values.mean().item() for name, values in rollout.components.items()},
        **{name: float(count) for name, count in rollout.failures.items()},
        "gold_reward": sum(gold) / len(gold),
        "accuracy": sum(correct) / len(correct),
        "truncated_rate": truncated_rate(rollout.completions),
        **episode_metrics(rollout.completions),
    }


def episode_metrics(completions: list[Completion]) -> dict[str, float]:
    """The means over a rollout's episodes of their turns, tool calls and tool errors, and the share that used up
    ``agent.max_turns``; none for single-turn completions."""
    episodes = [c.episode for c in completions if c.episode is not None]
    if not episodes:
        return {}
    count = len(episodes)
    return {
        **{name: sum(getattr(e, name) for e in episodes) / count for name in ("turns", "tool_calls", "tool_errors")},
        "max_turns_rate": sum(e.hit_max_turns for e in episodes) / count,
    }


def alarms(history: list[tuple[int, dict[str, float]]], cfg: RLConfig) -> list[str]:
    """What looks wrong at the latest iteration: KL running away, entropy collapsing, reward hacking, nothing to
    learn from (no right sample, or no group whose rewards differ, for ``SIGNAL_WINDOW`` iterations)."""
    latest = history[-1][1]
    found = []
    window = [metrics for _, metrics in history[-SIGNAL_WINDOW:]]
    if len(window) == SIGNAL_WINDOW and all(metrics.get("accuracy") == 0.0 for metrics in window):
        found.append(
            f"no sampled response was right in the last {SIGNAL_WINDOW} iterations (accuracy 0): only the rewards "
            "that do not grade correctness are teaching"
        )
    if len(window) == SIGNAL_WINDOW and all(metrics.get("zero_variance_groups") == 1.0 for metrics in window):
        found.append(
            f"every group's samples scored alike in the last {SIGNAL_WINDOW} iterations (zero_variance_groups 1): "
            "every advantage is 0 and the policy is not learning"
        )
    if latest.get("kl", 0.0) > cfg.kl_budget:
        found.append(f"KL to the reference {latest['kl']:.2f} is over kl_budget={cfg.kl_budget}")
    if latest.get("entropy", cfg.entropy_floor) < cfg.entropy_floor:  # an update that had no pairs logs none
        found.append(f"entropy {latest['entropy']:.3f} collapsed below entropy_floor={cfg.entropy_floor}")
    if len(history) >= 2 * HACKING_WINDOW:
        recent, before = history[-HACKING_WINDOW:], history[-2 * HACKING_WINDOW : -HACKING_WINDOW]

        def values(window, name: str) -> torch.Tensor:
            # an iteration that taught nothing has none
            return torch.tensor([m[name] for _, m in window if name in m], dtype=torch.float64)

        def change(name: str) -> float:
            return (values(recent, name).mean() - values(before, name).mean()).nan_to_num().item()

        def noise(name: str) -> float:
            """The standard error of ``change(name)`` from each window's spread: a fall one rollout batch's
            sampling explains (the gold reward of 128 responses moves by a few hundredths) is not a trend."""
            spread = [values(window, name) for window in (recent, before)]
            return sum(v.var().nan_to_num().item() / max(1, len(v)) for v in spread) ** 0.5

        if change("reward") > 0 and change("gold_reward") < -max(0.02, 2 * noise("gold_reward")):
            found.append(
                f"reward hacking? over the last {HACKING_WINDOW} iterations the reward moved "
                f"{change('reward'):+.3f} while the gold reward moved {change('gold_reward'):+.3f}"
            )
    return found


def heldout_gold_reward(roles: Roles, examples: list[Example], cfg: RLConfig, seed: int) -> float:
    """The current policy's mean gold reward on ``examples``, sampled as the rollouts are, from its own ``seed``
    (the probe leaves the run's random streams, and so its training, as they were)."""
    sampling = Sampling(cfg.max_new_tokens, n=cfg.group_size, temperature=cfg.temperature)
    completions = roles.actor.sample_current([e.prompt for e in examples], sampling, seed).result()
    gold = [gold_utility(examples[c.prompt_index], c.text, c.env_reward) for c in completions]
    return float(f"{sum(gold) / len(gold):.6g}")


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
    section = stage_kinds()[stage.partition("@")[0]].section
    tokenizer = load_tokenizer(init_dir)
    check_prompt_lengths(
        examples,
        tokenizer,
        PromptFormat.of(params.task),
        train_file,
        attrgetter(prompt_limit_key(section))(params),
        context_length(init_dir),
        (f"{section}.max_new_tokens", cfg.max_new_tokens),
    )
    if len(examples) < cfg.rollout_batch_size:
        raise ValueError(f"{stage}: {len(examples)} training prompts, fewer than rollout_batch_size")
    examples, probe = probe_split(examples, cfg, section)
    task = task_module(task_of(examples))
    check_tool_tags(task, tokenizer)
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
        samples_at = (lambda step: learner.offline(step) is None) if learner.offline else (lambda step: True)
        ahead = RolloutsAhead(roles, examples, cfg, params.seed, samples_at) if cfg.max_staleness else None
        judge = judge_dir(reward_dirs[0].parent) if reward_dirs else None
        signal = guard_signal(cfg, REWARD_MODEL in cfg.rewards and roles.reward is not None, judge is not None)
        guard = Guard(signal, probe) if signal else None
        state, reference_reset = _resume(roles, checkpointer, cfg, ahead, guard)
        for logged_step, metrics in state.history:
            log_step(live, logged_step, metrics)
        heldout = read_examples(train_file.with_name("test.jsonl"))[: cfg.heldout_prompts] if cfg.heldout_every else []
        if state.step == 0 and (heldout or guard):
            first = {HELDOUT: heldout_gold_reward(roles, heldout, cfg, params.seed)} if heldout else {}
            if guard:
                first |= guard.judge(roles, 0, cfg, probe_seed(params.seed, 0))
            state.history.append((0, first))
            log_step(live, 0, first)
        progress = tqdm(range(state.step, cfg.steps), desc=stage, initial=state.step, total=cfg.steps)
        parameters, updates = num_parameters(init_dir), Throughput()
        workers = cfg.parallel.num_workers
        threads = cfg.parallel.threads_per_worker if workers > 1 else torch.get_num_threads()
        raised: set[str] = set()
        timings: list[dict[str, float]] = []  # wall-clock: perf files, never the metrics (dvc.lock hashes those)
        for step in progress:
            started = time.perf_counter()
            clock = dict.fromkeys(("time/generate", "time/score", "time/train"), 0.0)
            try:
                rollout, metrics = learner.offline(step) if learner.offline else None, {}
                if rollout is None:
                    rollout, metrics = collect(roles, scorer, examples, cfg, state, params.seed, clock, ahead)
                if rollout is not None:
                    metrics |= rollout_metrics(rollout) if rollout.on_policy else {"offline_batch": 1.0}
                    metrics |= learner.learn(roles, rollout, tokenizer, cfg, state, clock)
                    if roles.rollout.apart:  # a sync, when one is due, hands the actor's weights to the engines
                        roles.rollout.load_weights(roles.actor.weights_for_engines().ref())
                over_budget = cfg.kl_budget_stop and metrics.get("kl", 0.0) > cfg.kl_budget
                if heldout and ((step + 1) % cfg.heldout_every == 0 or step + 1 == cfg.steps or over_budget):
                    metrics[HELDOUT] = heldout_gold_reward(roles, heldout, cfg, params.seed + step + 1)
                if guard and (guard.due(step + 1, cfg) or over_budget):
                    metrics |= guard.judge(roles, step + 1, cfg, probe_seed(params.seed, step + 1))
            except NonFiniteError as error:  # raised by a role (maybe on a Ray actor) that does not know the step
                raise NonFiniteError(f"{stage} step {step + 1}: {cause(error)}") from None
            if cfg.kl_target is not None and "kl" in metrics:
                state.kl_coef = adaptive_kl_coef(
                    state.kl_coef, metrics["kl"], cfg.kl_target, cfg.kl_horizon, len(rollout.scores)
                )
            state.step = step + 1
            if cfg.ref_reset_every and state.step % cfg.ref_reset_every == 0:
                reference_reset = roles.actor.weights().result()
                roles.reference.load_weights(reference_reset).result()
            logged = {name: float(f"{value:.6g}") for name, value in metrics.items()}
            state.history.append((state.step, logged))
            log_step(live, state.step, logged)
            # the phases and the bookkeeping around them; alarms and checkpoints come after
            phases = {name.removeprefix("time/"): seconds for name, seconds in clock.items()}
            timings.append({"step": state.step, **phases, "total": time.perf_counter() - started})
            if rollout is not None and clock["time/train"] > 0:
                # the update's model FLOPs utilisation: its passes over the rollout's real tokens, epochs times
                trained = rollout.tokens() * cfg.epochs
                updates.add(trained, clock["time/train"])
                timings[-1]["update_mfu"] = mfu(parameters, trained, clock["time/train"], threads, workers)
            progress.set_postfix(reward=logged.get("reward"), gold=logged.get("gold_reward"))
            for alarm in alarms(state.history, cfg):
                if alarm.split()[0] not in raised:
                    progress.write(f"WARNING {stage} step {state.step}: {alarm}")
                raised.add(alarm.split()[0])
            if over_budget:
                kl = metrics["kl"]
                progress.write(f"{stage} step {state.step}: KL {kl:.3f} passed kl_budget={cfg.kl_budget}: stop")
                live.summary["stopped_at"] = state.step
                break
            if state.step % cfg.save_every == 0 and state.step < cfg.steps:
                checkpointer.save(_checkpoint(roles, state, reference_reset, ahead, guard))
        final = _latest(state.history)
        for name in ("reward", "gold_reward", "accuracy", "truncated_rate", "kl", "kl_coef", "entropy", "divergence"):
            if name in final:
                live.summary[name] = final[name]
        live.summary["kl_budget"] = cfg.kl_budget
        # gold and proxy against √KL, the proxy being the reward model's score where it is one of the rewards
        curve = rl_curve(state.history, f"rewards/{REWARD_MODEL}" if REWARD_MODEL in cfg.rewards else "reward")
        if curve:
            write_curve(Path(live.dir), curve)
            live.summary.update(peak(curve))
        if heldout:
            live.summary["dip"], live.summary["recovery_iterations"] = dip_and_recovery(state.history)
        live.make_summary()
        if timings:
            numbers = {
                f"{phase}_seconds_per_step": sum(row[phase] for row in timings) / len(timings)
                for phase in ("generate", "score", "train", "total")
            }
            if updates.seconds:
                renamed = {"tokens_per_second": "update_tokens_per_second", "mfu": "update_mfu"}
                numbers |= {renamed.get(k, k): v for k, v in updates.numbers(parameters, threads, workers).items()}
            write_perf(live, numbers, timings)
        if guard:
            if guard.kept_step != state.step:  # the kept iteration's weights become the artifact
                roles.actor.restore(guard.kept_weights).result()
            live.summary["guard/kept_iteration"] = guard.kept_step
            progress.write(f"{stage}: guard: {guard.report(state.step)['why']}")
        roles.actor.save(out, init_dir).result()
        if guard:
            guard.write(out, state.step)
        if state.episodes:
            with open(out / EPISODES_FILE, "w") as handle:
                handle.writelines(json.dumps(row) + "\n" for row in state.episodes)
    checkpointer.clear()


def episode_rows(rollout: Rollout, step: int) -> list[dict[str, Any]]:
    """The rollout's episodes (none for a single-turn task) as the stage writes them: the iteration, the prompt,
    every turn and observation, the verdict on the final turn and the reward."""
    rows = []
    for index, completion in enumerate(rollout.completions):
        if (episode := completion.episode) is not None:
            formatted, correct = score_response(rollout.examples[index], completion.text, completion.env_reward)
            rows.append(
                {"step": step, "prompt": rollout.examples[index].prompt, "response": completion.text}
                | {"formatted": formatted, "correct": correct, "truncated": completion.truncated}
                | {"reward": round(float(rollout.scores[index]), 6)}
                | asdict(episode)
            )
    return rows


def probe_seed(seed: int, step: int) -> int:
    """The guard's probe after iteration ``step`` samples from a seed of its own (not heldout's, not training's)."""
    return seed + 7919 * (step + 1)


def _resume(
    roles: Roles, checkpointer: Checkpointer, cfg: RLConfig, ahead: RolloutsAhead | None, guard: Guard | None
) -> tuple[LoopState, dict | None]:
    """The loop's state, and the reference's weights when it has been reset: fresh, or from the checkpoint, whose
    models, optimisers and random states are loaded into the roles (its rollouts in flight into ``ahead``, its
    probes and kept weights into ``guard``)."""
    if (checkpoint := checkpointer.load()) is None:
        return LoopState(kl_coef=cfg.kl_coef), None
    roles.actor.load_state(checkpoint["actor"]).result()
    if roles.critic:
        roles.critic.load_state(checkpoint["critic"]).result()
    if roles.rollout.apart:
        roles.rollout.load_state(checkpoint["engines"]).result()
        if cfg.sync_every == 1:  # the engines sample from the policy as it is
            roles.rollout.load_weights(roles.actor.weights().ref()).result()
    if checkpoint["reference"] is not None:
        roles.reference.load_weights(checkpoint["reference"]).result()
    set_rng_state(checkpoint["rng"])
    if ahead is not None:
        ahead.load_state(checkpoint["ahead"])
    if guard is not None:
        guard.load_state(checkpoint["guard"])
    moments = RunningMoments(**checkpoint["state"]["moments"])
    return LoopState(**{**checkpoint["state"], "moments": moments}), checkpoint["reference"]


def _latest(history: list[tuple[int, dict[str, float]]]) -> dict[str, float]:
    """The last value of every metric (an iteration whose rollout taught nothing logs only sampling stats)."""
    latest: dict[str, float] = {}
    for _, metrics in history:
        latest.update(metrics)
    return latest


def _checkpoint(
    roles: Roles, state: LoopState, reference: dict | None, ahead: RolloutsAhead | None, guard: Guard | None
) -> dict[str, Any]:
    return {
        "guard": guard.state() if guard is not None else None,
        "ahead": ahead.state() if ahead is not None else None,  # first: the engines' state is theirs after these
        "actor": roles.actor.state().result(),
        **({"critic": roles.critic.state().result()} if roles.critic else {}),
        "engines": roles.rollout.state().result() if roles.rollout.apart else None,
        "reference": reference,
        "rng": rng_state(),
        "state": asdict(state),
        "step": state.step,
    }
