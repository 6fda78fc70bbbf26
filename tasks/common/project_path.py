"""Your own modules (task modules, tools, reward functions) import from the project directory, next to params.yaml,
before anything installed: a package of yours named like one alignflow ships (``examples``) is yours."""

import contextlib
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def project_first_on_path() -> Iterator[None]:
    """The working directory (the project) at the front of ``sys.path`` while your module imports, and at its end
    afterwards: a process spawned meanwhile (a sandbox) inherits the path, and a folder of yours named like one of
    alignflow's packages (``models``, ``tasks``) must not replace them there; a module of yours imported later, from
    inside a function, is still found."""
    here = os.getcwd()
    sys.path.insert(0, here)
    try:
        yield
    finally:
        sys.path.remove(here)  # the first occurrence: the one put there
        if here not in sys.path:
            sys.path.append(here)
