"""What the pipelines run: stage entry points (``stages``) and the library they share.

- ``stages/``: one module per stage kind, each a ``run(params)`` that reads its inputs and writes its outputs;
- ``rl/``: the RL trainer, its role workers, the algorithm registry (``core_algos``), reward functions and
  sequence packing;
- ``rollout/``: the rollout-engine interface and its Hugging Face and vLLM engines;
- ``data/``: problem families and their verifiers, datasets, the gold judge;
- ``common/``: the params schema and its validation, the stage registry, training helpers, metrics tracking,
  artifact paths and atomic writes, joining Ray.
"""
