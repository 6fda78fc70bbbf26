"""alignflow's benches, grouped by the question they answer (docs/benches.md lists every one with its command):
``trl`` (against TRL), ``learning`` (does it learn), ``speed`` (where the time goes), ``gpu`` (on a GPU). What they
share is ``harness``. Each runs as a module from the repository root: ``python -m bench.GROUP.NAME``.
"""
