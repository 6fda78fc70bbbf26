"""The params schema: one pydantic dataclass per section of params.yaml, each field with its help and bounds.

``tasks/params/load.py`` loads params.yaml into it (omegaconf: merging, interpolation, ``key=value``
overrides; pydantic: every type and bound); the CLI's ``--help`` and the Prefect run form read the same
fields. Each family's module declares its section types and, in its ``*Sections`` class, the sections of
``Params`` with their defaults: a new stage's config is one class and one field in one module. Which stage
runs with which section is declared in ``tasks/kinds.py``.
"""

from __future__ import annotations

from tasks.common.config.agents import AgentDataConfig, AgentSections
from tasks.common.config.fields import ConfigError, schema_section, to_dict
from tasks.common.config.operations import (
    GATE_METRICS,
    GUARD_DIRECTIONS,
    OperationsSections,
    RemoteConfig,
    RetrainConfig,
    RunnerConfig,
)
from tasks.common.config.rl import (
    LEARNERS,
    DistillConfig,
    OnlineDPOConfig,
    PPOConfig,
    RejectionConfig,
    RejectionSamplingConfig,
    RLConfig,
    RLSections,
    RoundConfig,
    TeacherDataConfig,
    VLLMConfig,
    engine_in_actor,
)
from tasks.common.config.sections import (
    SEED_MAX,
    AgentConfig,
    BaseConfig,
    BestOfNConfig,
    DataConfig,
    DPOConfig,
    EvalConfig,
    InferenceConfig,
    LoraConfig,
    ModelSizeConfig,
    ModelTrainingConfig,
    OptimizationConfig,
    ParallelConfig,
    PreferencesConfig,
    RewardBackboneConfig,
    RewardModelConfig,
    SFTConfig,
    SFTTrainingConfig,
    StageResources,
    SupervisedSections,
)
from tasks.common.config.task import ArithmeticConfig, CountdownConfig, TaskConfig


@schema_section
class Params(OperationsSections, AgentSections, RLSections, SupervisedSections):
    """All of params.yaml: the supervised sections first, then the RL ones, then the agent pipeline's, then how runs
    are operated."""


__all__ = [
    "GATE_METRICS",
    "GUARD_DIRECTIONS",
    "LEARNERS",
    "SEED_MAX",
    "AgentConfig",
    "AgentDataConfig",
    "ArithmeticConfig",
    "BaseConfig",
    "BestOfNConfig",
    "ConfigError",
    "CountdownConfig",
    "DataConfig",
    "DistillConfig",
    "DPOConfig",
    "EvalConfig",
    "InferenceConfig",
    "ModelSizeConfig",
    "LoraConfig",
    "ModelTrainingConfig",
    "OnlineDPOConfig",
    "OptimizationConfig",
    "ParallelConfig",
    "Params",
    "PPOConfig",
    "PreferencesConfig",
    "RejectionConfig",
    "RejectionSamplingConfig",
    "RemoteConfig",
    "RetrainConfig",
    "RewardBackboneConfig",
    "RewardModelConfig",
    "RLConfig",
    "VLLMConfig",
    "RoundConfig",
    "RunnerConfig",
    "SFTConfig",
    "SFTTrainingConfig",
    "StageResources",
    "TaskConfig",
    "TeacherDataConfig",
    "engine_in_actor",
    "to_dict",
]
