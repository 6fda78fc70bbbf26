"""Reading a pipeline's DAG from DVC's own index, one reader at a time."""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import networkx as nx
from dvc.repo import Repo

# DVC is not thread-safe: two threads loading dvc.yaml at once fail its validation now and then, and a
# flow's stages finish side by side on threads of one process.
_ONE_AT_A_TIME = threading.Lock()


@contextmanager
def open_repo(root: str | Path) -> Iterator[Repo]:
    """DVC's ``Repo`` of the project at ``root``, opened while no other thread of this process has one open."""
    with _ONE_AT_A_TIME, Repo(str(root)) as repo:
        yield repo


def dependencies_first(repo: Repo) -> list[Any]:
    """The stages of ``repo``'s pipeline, each after the stages it depends on, ties in declaration order."""
    position = {stage: i for i, stage in enumerate(repo.index.stages)}
    # DVC's graph points from a stage to the stages it depends on.
    upstream_to_downstream = repo.index.graph.reverse(copy=True)
    return list(nx.lexicographical_topological_sort(upstream_to_downstream, key=lambda s: position[s]))
