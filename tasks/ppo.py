"""Stage `ppo`: PPO against the reward model, KL-anchored to the SFT policy (InstructGPT's third stage).

One iteration, top to bottom:

1. roll out: the actor samples one response per prompt (HF or vLLM engine);
2. score: the reward model scores each response; the reference and the actor give the
   log-probs of every sampled token, the critic the value of the state before it;
3. shape: r_t = −β·log π/π_ref at every token, plus the (normalised, clipped) score at
   the last one; GAE(γ, λ) over the response tokens, advantages whitened;
4. train: K epochs × minibatches of the clipped surrogate (actor) and the clipped value
   loss (critic), each with its own optimizer and gradient clipping;
5. control: β follows the adaptive KL controller toward ``ppo.kl_target`` (or stays fixed).

The gold judge (hidden from training) scores every rollout too, so reward hacking shows
as RM reward rising while gold reward falls. A checkpoint every ``ppo.save_every``
iterations holds actor, critic, optimizers, schedules, β, reward statistics, RNG and the
metric history; the data position follows from the iteration.
"""

import math
import time
from dataclasses import asdict, dataclass

import torch
from tqdm.auto import tqdm

from models import load_tokenizer
from tasks.artifacts import DATA_DIR, atomic_output, model_dir
from tasks.config import Params, PPOConfig, to_dict
from tasks.core_algos import adaptive_kl_coef, explained_variance, gae, kl_k1, masked_mean, shaped_rewards, whiten
from tasks.datasets import read_examples
from tasks.judge import gold_utility
from tasks.reward import REWARD_DIR, member_dirs
from tasks.sequences import pack
from tasks.tracking import log_step, stage_live
from tasks.training import Checkpointer, epoch_batch, fingerprint, make_deterministic, rng_state, set_rng_state
from tasks.workers import Worker, place

HACKING_WINDOW = 10  # iterations compared when looking for RM reward up while gold reward goes down


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


def prepare_scores(raw: torch.Tensor, cfg: PPOConfig, moments: RunningMoments) -> torch.Tensor:
    scores = raw
    if cfg.reward_normalize:
        moments.update(raw)
        scores = moments.normalize(raw)
    if cfg.reward_clip is not None:
        scores = scores.clamp(-cfg.reward_clip, cfg.reward_clip)
    return scores


def alarms(history: list[tuple[int, dict[str, float]]], cfg: PPOConfig) -> list[str]:
    """What looks wrong at the latest iteration: KL running away, entropy collapsing, reward hacking."""
    latest = history[-1][1]
    found = []
    if latest["kl"] > cfg.kl_budget:
        found.append(f"KL to the reference {latest['kl']:.2f} is over ppo.kl_budget={cfg.kl_budget}")
    if latest["entropy"] < cfg.entropy_floor:
        found.append(f"entropy {latest['entropy']:.3f} collapsed below ppo.entropy_floor={cfg.entropy_floor}")
    if len(history) >= 2 * HACKING_WINDOW:
        recent, before = history[-HACKING_WINDOW:], history[-2 * HACKING_WINDOW : -HACKING_WINDOW]

        def change(name: str) -> float:
            return sum(m[name] for _, m in recent) / HACKING_WINDOW - sum(m[name] for _, m in before) / HACKING_WINDOW

        if change("rm_reward") > 0 and change("gold_reward") < -0.02:
            found.append(
                f"reward hacking? over the last {HACKING_WINDOW} iterations RM reward moved "
                f"{change('rm_reward'):+.3f} while gold reward moved {change('gold_reward'):+.3f}"
            )
    return found


def iterate(
    roles: dict[str, Worker], examples, tokenizer, cfg: PPOConfig, kl_coef: float, moments: RunningMoments
) -> dict[str, float]:
    """One PPO iteration on ``examples``; returns its metrics."""
    actor, critic, reference, reward = roles["actor"], roles["critic"], roles["reference"], roles["reward"]
    prompts = [example.prompt for example in examples]

    started = time.perf_counter()
    completions = actor.call("generate", prompts).result()
    generated = time.perf_counter()

    batch = pack(
        [tokenizer(p)["input_ids"] for p in prompts], [c.token_ids for c in completions], tokenizer.pad_token_id
    )
    mask = batch.response_mask
    pending = {
        "scores": reward.call("score", prompts, [c.text for c in completions]),
        "ref_logprobs": reference.call("logprobs", batch),
        "values": critic.call("values", batch),
        "logprobs": actor.call("logprobs", batch),
    }
    out = {name: call.result() for name, call in pending.items()}
    scored = time.perf_counter()

    engine_logprobs = torch.zeros_like(mask)
    for row, completion in enumerate(completions):
        engine_logprobs[row, : len(completion.logprobs)] = torch.tensor(completion.logprobs)
    scores = prepare_scores(out["scores"], cfg, moments)
    rewards = shaped_rewards(scores, out["logprobs"], out["ref_logprobs"], mask, kl_coef)
    advantages, returns = gae(rewards, out["values"], mask, cfg.gamma, cfg.lam)
    advantages = whiten(advantages, mask)
    actor_update = actor.call("update", batch, out["logprobs"], advantages)
    critic_update = critic.call("update", batch, out["values"], returns)
    metrics = {**actor_update.result(), **critic_update.result()}
    trained = time.perf_counter()

    gold = [gold_utility(e, c.text) for e, c in zip(examples, completions, strict=True)]
    return {
        **metrics,
        "rm_reward": out["scores"].mean().item(),
        "gold_reward": sum(gold) / len(gold),
        "kl": (kl_k1(out["logprobs"], out["ref_logprobs"]) * mask).sum(-1).mean().item(),
        "kl_coef": kl_coef,
        "explained_variance": explained_variance(out["values"], returns, mask).item(),
        "response_length": mask.sum(-1).mean().item(),
        "logprob_parity": masked_mean((engine_logprobs - out["logprobs"]).abs(), mask).item(),
        "time/generate": generated - started,
        "time/score": scored - generated,
        "time/train": trained - scored,
    }


def run(params: Params) -> None:
    cfg = params.ppo
    make_deterministic(params.seed)
    sft_dir, train_file = model_dir("sft"), DATA_DIR / "train.jsonl"
    examples = read_examples(train_file)
    if len(examples) < cfg.rollout_batch_size:
        raise ValueError(f"ppo: {len(examples)} training prompts, fewer than ppo.rollout_batch_size")
    tokenizer = load_tokenizer(sft_dir)
    reward_dirs = member_dirs(REWARD_DIR)
    roles = place(params, sft_dir, reward_dirs)

    config = {"stage": "ppo", "seed": params.seed, "device": params.device, **to_dict(cfg)}
    checkpointer = Checkpointer("ppo", fingerprint(config, [sft_dir, REWARD_DIR, train_file]))
    start, history, kl_coef, moments = 0, [], cfg.kl_coef, RunningMoments()
    if (checkpoint := checkpointer.load()) is not None:
        roles["actor"].call("load_state", checkpoint["actor"]).result()
        roles["critic"].call("load_state", checkpoint["critic"]).result()
        set_rng_state(checkpoint["rng"])
        start, history, kl_coef = checkpoint["step"], checkpoint["history"], checkpoint["kl_coef"]
        moments = RunningMoments(**checkpoint["moments"])
        print(f"ppo: resuming from the checkpoint at step {start} ({checkpointer.path})", flush=True)

    with atomic_output(model_dir("ppo")) as out, stage_live("ppo") as live:
        for logged_step, metrics in history:
            log_step(live, logged_step, metrics)
        progress = tqdm(range(start, cfg.steps), desc="ppo", initial=start, total=cfg.steps)
        raised: set[str] = set()
        for step in progress:
            batch = [examples[i] for i in epoch_batch(len(examples), cfg.rollout_batch_size, step, params.seed)]
            metrics = iterate(roles, batch, tokenizer, cfg, kl_coef, moments)
            if cfg.kl_target is not None:
                kl_coef = adaptive_kl_coef(kl_coef, metrics["kl"], cfg.kl_target, cfg.kl_horizon, len(batch))
            done = step + 1
            # Wall-clock times vary run to run: log them, but keep them out of the resumable history.
            timings = {name: round(value, 4) for name, value in metrics.items() if name.startswith("time/")}
            logged = {name: float(f"{value:.6g}") for name, value in metrics.items() if name not in timings}
            history.append((done, logged))
            log_step(live, done, logged)
            log_step(live, done, timings, prefix="")
            progress.set_postfix(rm=logged["rm_reward"], gold=logged["gold_reward"], kl=logged["kl"])
            for alarm in alarms(history, cfg):
                if alarm.split()[0] not in raised:
                    progress.write(f"WARNING ppo step {done}: {alarm}")
                raised.add(alarm.split()[0])
            if done % cfg.save_every == 0 and done < cfg.steps:
                checkpointer.save(
                    {
                        "actor": roles["actor"].call("state").result(),
                        "critic": roles["critic"].call("state").result(),
                        "rng": rng_state(),
                        "step": done,
                        "history": history,
                        "kl_coef": kl_coef,
                        "moments": asdict(moments),
                    }
                )
        final = history[-1][1]
        for name in ("rm_reward", "gold_reward", "kl", "kl_coef", "entropy"):
            live.summary[name] = final[name]
        live.summary["kl_budget"] = cfg.kl_budget
        live.make_summary()
        roles["actor"].call("save", out, sft_dir).result()
    checkpointer.clear()
