"""The pipelines alignflow knows, by name: what each trains and which dvc.yaml stages it ends in."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Pipeline:
    description: str
    targets: tuple[str, ...]  # the final stages (or foreach groups); a run covers them and everything upstream


PIPELINES: dict[str, Pipeline] = {
    "sft": Pipeline(
        "Supervised fine-tuning: data -> base -> sft, with held-out evaluation of base and sft.",
        ("eval@base", "eval@sft"),
    ),
    "rlhf": Pipeline(
        "RLHF (InstructGPT): data -> base -> sft -> preference pairs judged -> Bradley-Terry reward model "
        "(checked by best-of-n) -> PPO from a small-demonstration SFT (sft_cold), beside the same PPO rewarded by "
        "the exact verifier (ppo_verifier), with held-out evaluation of every model.",
        ("eval@base", "eval@sft", "eval@sft_cold", "best_of_n", "eval@ppo", "eval@ppo_verifier"),
    ),
    "r1": Pipeline(
        "DeepSeek-R1: data -> base -> cold-start SFT -> GRPO with verifiable rewards -> per round (params "
        "`rounds`): rejection sampling -> SFT on the accepted samples -> final RL with mixed rewards (rule-based "
        "and the RLHF reward model), with held-out evaluation of every model.",
        ("eval@base", "eval@sft", "eval@sft_cold", "eval@grpo", "eval_sft_rs", "eval_grpo_final"),
    ),
    "r1_zero": Pipeline(
        "DeepSeek-R1-Zero: data -> base -> GRPO with verifiable rewards straight from the base model, with "
        "held-out evaluation of base and grpo_zero.",
        ("eval@base", "eval@grpo_zero"),
    ),
    "offline_to_online": Pipeline(
        "Offline-to-online: data -> base -> cold-start SFT (the policy with headroom) -> preference pairs sampled "
        "from it and judged -> the reference's log-probs of every pair, once -> offline DPO (dpo.loss) -> online "
        "DPO from that checkpoint (online_dpo.update: preference, or policy_gradient for GRPO/PPO), with the dip "
        "across the switch and held-out evaluation of every model.",
        ("eval@base", "eval@sft_cold", "eval@dpo", "eval@online_dpo"),
    ),
}
