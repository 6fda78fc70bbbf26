"""The pipelines alignflow knows, by name: what each trains and which dvc.yaml stages it ends in."""

import re
from collections.abc import Iterable
from dataclasses import dataclass

from tasks.common.config import Params
from tasks.common.registry import param_value, read_artifacts
from tasks.kinds import model_kinds, stage_kinds


def round_kinds() -> set[str]:
    return set(model_kinds()[1])


_PARAM = re.compile(r"\$\{([\w.]+)\}")


def evaluation_of(model: str) -> str:
    """The dvc.yaml stage that evaluates ``model``: ``eval@sft``, ``agent_eval@agent_sft``, or for a round's model
    (``sft_rs/1``) ``eval_sft_rs@1``, the stage its round's foreach group names."""
    kind, _, round_name = model.partition("/")
    evaluation = stage_kinds()[kind].evaluation if kind in stage_kinds() else "eval"
    return f"{evaluation}_{kind}@{round_name}" if round_name else f"{evaluation}@{kind}"


@dataclass(frozen=True)
class Pipeline:
    description: str
    # The final stages (or foreach groups); a run covers them and everything upstream. "eval@${distill.teacher}"
    # evaluates whichever model that key names.
    targets: tuple[str, ...]
    # The model it delivers, which `alignflow retrain` gates and registers; a round's kind means the last round's.
    delivers: str
    delivers_desc: str  # what that model is, for the registry (dvc.yaml's artifacts)

    def model(self, params: Params) -> str:
        """The delivered model's name: ``sft``, or ``grpo_final/1`` for the last of R1's rounds."""
        return f"{self.delivers}/{list(params.rounds)[-1]}" if self.delivers in round_kinds() else self.delivers

    def stages(self, params: Params) -> tuple[str, ...]:
        """The targets with every ${key} read from ``params``."""
        resolved = []
        for target in self.targets:
            if (reference := _PARAM.search(target)) is not None:
                target = evaluation_of(str(param_value(params, reference.group(1))))
            resolved.append(target)
        return tuple(resolved)


PIPELINES: dict[str, Pipeline] = {
    "sft": Pipeline(
        "Supervised fine-tuning: data -> base -> sft, with held-out evaluation of base and sft.",
        ("eval@base", "eval@sft"),
        "sft",
        "the sft pipeline's policy, fine-tuned on worked solutions",
    ),
    "rlhf": Pipeline(
        "RLHF (InstructGPT): data -> base -> sft -> preference pairs judged -> Bradley-Terry reward model "
        "(checked by best-of-n) -> PPO from a small-demonstration SFT (sft_cold), beside the same PPO rewarded by "
        "the exact verifier (ppo_verifier), with held-out evaluation of every model.",
        ("eval@base", "eval@sft", "eval@sft_cold", "best_of_n", "eval@ppo", "eval@ppo_verifier"),
        "ppo",
        "the rlhf pipeline's PPO policy, rewarded by the learned reward model",
    ),
    "r1": Pipeline(
        "DeepSeek-R1: data -> base -> cold-start SFT -> GRPO with verifiable rewards -> per round (params "
        "`rounds`): rejection sampling -> SFT on the accepted samples -> final RL with mixed rewards (rule-based "
        "and the RLHF reward model), with held-out evaluation of every model.",
        ("eval@base", "eval@sft", "eval@sft_cold", "eval@grpo", "eval_sft_rs", "eval_grpo_final"),
        "grpo_final",
        "the r1 pipeline's final RL policy",
    ),
    "r1_zero": Pipeline(
        "DeepSeek-R1-Zero: data -> base -> GRPO with verifiable rewards straight from the base model, with "
        "held-out evaluation of base and grpo_zero.",
        ("eval@base", "eval@grpo_zero"),
        "grpo_zero",
        "the r1_zero pipeline's GRPO policy, trained straight from the base model",
    ),
    "offline_to_online": Pipeline(
        "Offline-to-online: data -> base -> cold-start SFT (the policy with headroom) -> preference pairs sampled "
        "from it and judged -> the reference's log-probs of every pair, once -> offline DPO (dpo.preference_loss) "
        "-> online DPO from that checkpoint (online_dpo.update: preference, or policy_gradient for GRPO/PPO), with "
        "the dip across the switch and held-out evaluation of every model.",
        ("eval@base", "eval@sft_cold", "eval@dpo", "eval@online_dpo"),
        "online_dpo",
        "the offline_to_online pipeline's online policy",
    ),
    "distill": Pipeline(
        "Distillation: data -> base -> the teacher (distill.teacher: R1's grpo by default, its stages reused) -> "
        "the teacher's verified samples (teacher_data) -> a student a third of its size (student_base) fine-tuned "
        "on them (sft_distill) -> on-policy distillation, the teacher grading every token the student samples "
        "(distill.distill_loss: reverse_kl or gkd), with held-out evaluation and the parameter count of every model.",
        ("eval@${distill.teacher}", "eval@student_base", "eval@sft_distill", "eval@distill"),
        "distill",
        "the distill pipeline's student, distilled on-policy from the teacher",
    ),
    "agent": Pipeline(
        "Agents: agent data (agent_data.task, a task with tools or an environment, with worked multi-turn traces) -> "
        "agent_base -> SFT on the traces (agent_sft) -> GRPO on episodes in the environment (agent_grpo), with "
        "held-out evaluation as an agent (agent_eval: pass@1 with tools, turns, tool calls, every episode written).",
        ("agent_eval@agent_sft", "agent_eval@agent_grpo"),
        "agent_grpo",
        "the agent pipeline's policy, trained by GRPO on episodes in its task's environment",
    ),
}


def kinds_run(names: Iterable[str], params: Params, as_stages: bool = False) -> set[str]:
    """The stage kinds a run of ``names`` runs: each name a pipeline (unless ``as_stages``: ``sft`` and ``distill``
    are both), a dvc.yaml stage (``eval@sft``, ``rejection@1``) or a foreach group (``rejection``, ``eval_sft_rs``),
    with everything upstream of it."""
    kinds, evaluations = stage_kinds(), {kind.evaluation for kind in stage_kinds().values()}
    pipelines = {} if as_stages else PIPELINES
    todo = [stage for name in names for stage in (pipelines[name].stages(params) if name in pipelines else [name])]
    seen, run = set(), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        kind_name, _, target = name.partition("@")
        if kind_name not in kinds:  # a round model's evaluation group, eval_sft_rs[@ROUND]; else no stage at all
            evaluation = next((e for e in evaluations if kind_name.startswith(f"{e}_")), None)
            model = kind_name.removeprefix(f"{evaluation}_")
            if evaluation is not None and model in round_kinds():
                todo += [f"{evaluation}@{model}/{r}" for r in ([target] if target else params.rounds)]
            continue
        kind = kinds[kind_name]
        if kind.target == "round" and not target:
            todo += [f"{kind_name}@{r}" for r in params.rounds]
            continue
        if kind.target == "round" and target not in params.rounds:
            continue  # no such round: the stage lookup says so, naming the rounds
        run.add(kind_name)
        todo += [artifact.replace("/", "@") for artifact in read_artifacts(kind, params, target or None).values()]
    return run
