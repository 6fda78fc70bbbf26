"""Stage entry points, each called with its ``StageRun``; the kinds are declared in ``tasks/kinds.py``."""
