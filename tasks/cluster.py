"""Joining Ray: the cluster params name, or a local one sized to this machine."""

import os

import ray

from tasks.config import RunnerConfig


def connect_ray(runner: RunnerConfig) -> None:
    """Join the cluster at ``runner.ray_address`` or RAY_ADDRESS, else start a local Ray once per process."""
    if ray.is_initialized():
        return
    address = runner.ray_address or os.environ.get("RAY_ADDRESS")
    # Ray runs workers at nice 15 by default; stages must get the CPU share they get under `dvc repro`.
    local = (
        {}
        if address
        else {"num_cpus": os.cpu_count(), "include_dashboard": False, "_system_config": {"worker_niceness": 0}}
    )
    ray.init(address=address, log_to_driver=False, configure_logging=False, **local)
