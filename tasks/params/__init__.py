"""params.yaml: loaded through omegaconf, validated by the pydantic schema (``tasks/common/config``) and then by the
rules across fields and files (``rules.py``), before any stage runs. The top of ``tasks``: the rules read every
layer below (task modules, datasets, reward-model kinds, stage kinds and the pipelines)."""
