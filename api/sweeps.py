"""Where a sweep of plans runs: local processes, or tasks on a Ray cluster.

Both are `planner.fleet.Mapper`s: they apply a picklable top-level function to every item
and yield the results in the items' order, so a sweep gives the same plans either way.
Ray is optional (`pip install 'hetplan[ray]'`); asking for it without it installed is a
clear error. A Ray task whose worker dies is retried by Ray (`RAY_TASK_RETRIES` times),
so a lost worker costs only its task.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any, TypeVar

__all__ = ["RayUnavailable", "RAY_TASK_RETRIES", "sweep_mapper", "local_mapper", "ray_mapper"]

T = TypeVar("T")
R = TypeVar("R")

RAY_TASK_RETRIES = 3
"""Times Ray reruns a task whose worker process died (Ray's `max_retries`)."""


class RayUnavailable(RuntimeError):
    """`--ray` was given but Ray is not installed."""


@contextlib.contextmanager
def local_mapper(jobs: int) -> Iterator[Callable[[Callable[[T], R], Sequence[T]], Iterator[R]]]:
    """Items on `jobs` local processes (in turn, in this process, when `jobs` is 1)."""
    if jobs <= 1:
        yield lambda fn, items: iter(map(fn, items))
        return
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        yield lambda fn, items: iter(pool.map(fn, items))


@contextlib.contextmanager
def ray_mapper(address: str, jobs: int) -> Iterator[Callable[[Callable[[T], R], Sequence[T]],
                                                             Iterator[R]]]:
    """Items as Ray tasks. `address` `auto` starts a local Ray with `jobs` CPUs (stopped
    afterwards); any other address (`ray://host:10001`, `host:6379`) joins that cluster."""
    try:
        import ray
    except ImportError as error:
        raise RayUnavailable(f"--ray needs Ray, which is not installed ({error}); install "
                             "it with pip install 'hetplan[ray]'") from None
    started_here = not ray.is_initialized()
    if started_here:
        if address == "auto":
            ray.init(num_cpus=jobs, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        else:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
    try:
        yield lambda fn, items: _ray_map(ray, fn, items)
    finally:
        if started_here:
            ray.shutdown()


def _ray_map(ray: Any, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
    remote = ray.remote(max_retries=RAY_TASK_RETRIES, num_cpus=1)(fn)
    refs = [remote.remote(item) for item in items]
    for ref in refs:
        yield ray.get(ref)


def sweep_mapper(ray_address: str | None,
                 jobs: int) -> contextlib.AbstractContextManager[Callable[..., Iterator[Any]]]:
    """Ray tasks when `ray_address` is given, else `jobs` local processes."""
    return local_mapper(jobs) if ray_address is None else ray_mapper(ray_address, jobs)
