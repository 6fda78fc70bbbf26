"""Reading a pipeline's DAG from DVC's own index."""

from typing import Any

import networkx as nx
from dvc.repo import Repo


def dependencies_first(repo: Repo) -> list[Any]:
    """The stages of ``repo``'s pipeline, each after the stages it depends on, ties in declaration order."""
    position = {stage: i for i, stage in enumerate(repo.index.stages)}
    # DVC's graph points from a stage to the stages it depends on.
    upstream_to_downstream = repo.index.graph.reverse(copy=True)
    return list(nx.lexicographical_topological_sort(upstream_to_downstream, key=lambda s: position[s]))
