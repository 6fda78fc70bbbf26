"""The params sections of the agent pipeline (data -> base -> SFT on worked traces -> GRPO on the environment ->
eval with tools) and of the episodes every stage plays on a task with tools or an environment.

The agent pipeline's stages have sections of their own beside the default pipelines': its task is not
``task.name`` (a params file holds both), its episodes are longer than single answers (its base model has more
positions, its SFT longer sequences, its eval more tokens a turn), and a change here re-runs only its stages.
"""

from __future__ import annotations

from tasks.common.config.fields import param, schema_section, section
from tasks.common.config.rl import GRPO, RLConfig
from tasks.common.config.sections import (
    AgentConfig,
    BaseConfig,
    DataConfig,
    EvalConfig,
    SFTConfig,
)
from tasks.common.config.task import TASK_MODULE_PATTERN


@schema_section
class AgentDataConfig(DataConfig):
    task: str = param(
        "examples.calculator",
        "The agent pipeline's task: a module with TOOLS or an environment, by its import path from the project "
        "directory (examples.calculator, examples.guess_number; docs/agents.md).",
        pattern=TASK_MODULE_PATTERN,
    )


# A worked calculator episode is about 150 positions (prompt, call, result, answer): the tiny model's default 128
# does not hold it. Copying the tool's result into the answer comes late in SFT (docs/agents.md: 400 steps are too
# few).
_AGENT_BASE = {"max_position_embeddings": 256}
_AGENT_SFT = {"init": "agent_base", "max_length": 224, "max_steps": 800, "warmup_steps": 20, "save_every": 100}
# A turn is a tool call (about 80 characters in the Hermes format) or an answer: each fits 96 new tokens.
_AGENT_TURN_TOKENS = 96
AGENT_GRPO = GRPO | {
    "steps": 60,
    "rollout_batch_size": 16,
    "group_size": 8,
    "minibatch_size": 128,
    "max_new_tokens": _AGENT_TURN_TOKENS,
    "rewards": {"accuracy": 1.0, "format": 0.1, "environment": 0.5},
}


@schema_section
class AgentSections:
    """The sections of params.yaml for episodes and the agent pipeline: ``Params`` holds them."""

    agent: AgentConfig = section(AgentConfig, "Multi-turn episodes: tool calls and interactive environments.")
    agent_data: AgentDataConfig = section(
        AgentDataConfig,
        "Agent pipeline: its task's problems, with worked multi-turn traces.",
        num_train=2000,
        num_test=200,
    )
    agent_base: BaseConfig = section(
        BaseConfig, "Agent pipeline: the base model, with room for whole episodes.", **_AGENT_BASE
    )
    agent_sft: SFTConfig = section(
        SFTConfig,
        "Agent pipeline: SFT on the worked traces (the model's turns; tool results are context).",
        **_AGENT_SFT,
    )
    agent_grpo: RLConfig = section(
        RLConfig, "Agent pipeline: GRPO on episodes in the task's environment, from agent_sft.", **AGENT_GRPO
    )
    agent_eval: EvalConfig = section(
        EvalConfig,
        "Agent pipeline: held-out evaluation of its models as agents (max_new_tokens a turn).",
        max_new_tokens=_AGENT_TURN_TOKENS,
        k=4,
    )
