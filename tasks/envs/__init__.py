"""Environments, pluggable by name: each provides tasks, a tool service per task and expert demonstrations."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tasks.envs import desk
from tasks.envs.base import Episode, Task, ToolService
from tasks.envs.toolset import load_toolset


@dataclass(frozen=True)
class Environment:
    name: str
    generate_tasks: Callable[..., list[Task]]
    make_service: Callable[[Task], ToolService]  # grounding needs its `solves`
    demonstration: Callable
    toolset_dir: Path  # where the shipped toolsets live (registry_v{N}.json); data for tasks.envs.toolset

    def load_toolset(self, source) -> dict:
        """tasks.envs.toolset.load_toolset with this environment's shipped versions."""
        return load_toolset(source, self.name)


ENVIRONMENTS = {"desk": Environment("desk", desk.generate_tasks, desk.make_service, desk.demonstration,
                                    desk.TOOLSET_DIR)}


def get_env(name: str) -> Environment:
    try:
        return ENVIRONMENTS[name]
    except KeyError:
        raise KeyError(f"unknown environment {name!r}; known: {sorted(ENVIRONMENTS)}") from None


def new_episode(task: Task, chat, **limits) -> Episode:
    return Episode(task, chat, get_env(task.env).make_service(task), **limits)
