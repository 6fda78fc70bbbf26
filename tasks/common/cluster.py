"""Joining Ray: the cluster params name, or a local one sized to this machine."""

import os
import threading

import ray

from tasks.common.config import RunnerConfig

_shutting_down: threading.Thread | None = None
_held = False  # hold_ray: this process stays in Ray between runs

# A local Ray shares the machine's cores with the stages it runs, so it should be quiet when idle:
LOCAL_RAY = {
    "worker_niceness": 0,  # Ray runs workers at nice 15; stages must get the CPU share they get under `dvc repro`
    "enable_worker_prestart": False,  # start workers on demand, not one idle worker per core
    "num_workers_soft_limit": 1,  # keep one idle worker warm for the next stage, not one per core
    "metrics_report_interval_ms": 60_000,  # nobody scrapes a local Ray's metrics
    "task_events_report_interval_ms": 5_000,
    "event_stats": False,
}


STAGE_DIRECTORY = "ALIGNFLOW_STAGE_DIRECTORY"


def enter_stage_directory() -> None:
    """Ray runs this in each worker of a stage that joined a cluster by address, before the worker's first task:
    the stage's directory, where its relative paths point, when this machine has it (a worker on another node
    keeps its own, as the data-parallel workers' ``join`` does)."""
    directory = os.environ.get(STAGE_DIRECTORY)
    if directory and os.path.isdir(directory):
        os.chdir(directory)


def connect_ray(runner: RunnerConfig, log_to_driver: bool = False) -> str:
    """Join the cluster at ``runner.ray_address`` or RAY_ADDRESS, else start a local Ray once per process;
    return the cluster's address. ``log_to_driver``: print what this process's Ray workers print (a stage's
    data-parallel workers: rank 0's progress is the stage's)."""
    if _shutting_down is not None:
        _shutting_down.join()
    if not ray.is_initialized():
        address = runner.ray_address or os.environ.get("RAY_ADDRESS")
        if address:
            # A cluster started elsewhere starts its workers in its own directory: the stage's paths are relative
            # to the stage's (a local Ray's workers start in it)
            in_the_stages_directory = {
                "env_vars": {STAGE_DIRECTORY: os.getcwd()},
                "worker_process_setup_hook": f"{__name__}.{enter_stage_directory.__name__}",
            }
            ray.init(
                address=address,
                log_to_driver=log_to_driver,
                configure_logging=False,
                runtime_env=in_the_stages_directory,
            )
        else:  # "local": our own Ray, even when a `ray start` cluster runs here (ray.init() would join that)
            ray.init(
                address="local",
                num_cpus=os.cpu_count(),
                include_dashboard=False,
                _system_config=LOCAL_RAY,
                log_to_driver=log_to_driver,
                configure_logging=False,
            )
    return ray.get_runtime_context().gcs_address


def hold_ray() -> None:
    """Stay in Ray for as long as this process lives: ``release_ray`` leaves it joined. For a process that runs
    one flow after another (``alignflow serve``), so no run pays Ray's start-up or shutdown."""
    global _held
    _held = True


def release_ray() -> None:
    """Leave Ray (stopping a local one) in the background: it takes a second or two, and nothing waits on it
    but the next ``connect_ray`` (and the interpreter's exit). Nothing, in a process that holds Ray."""
    global _shutting_down
    if _held:
        return
    _shutting_down = threading.Thread(target=ray.shutdown, name="ray-shutdown")
    _shutting_down.start()
