"""Environments, pluggable by name: each provides tasks, a tool service per task and expert demonstrations."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tasks.envs import desk
from tasks.envs.base import Episode, Task, ToolService


@dataclass(frozen=True)
class Environment:
    name: str
    generate_tasks: Callable[..., list[Task]]
    make_service: Callable[[Task], ToolService]  # grounding needs its `solves`
    demonstration: Callable
    load_registry: Callable[[str], dict]


ENVIRONMENTS = {"desk": Environment("desk", desk.generate_tasks, desk.make_service, desk.demonstration, desk.load_registry)}


def get_env(name: str) -> Environment:
    try:
        return ENVIRONMENTS[name]
    except KeyError:
        raise KeyError(f"unknown environment {name!r}; known: {sorted(ENVIRONMENTS)}") from None


def new_episode(task: Task, tokenizer, **limits) -> Episode:
    return Episode(task, tokenizer, get_env(task.env).make_service(task), **limits)
