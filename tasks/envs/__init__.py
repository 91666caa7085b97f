"""Environments as plugins: each gives tasks, a tool session per episode, a verifier, and optionally
demonstrations for the SFT bootstrap.

`env.name` (settings) names one, resolved in this order:

    tasks.envs.desk:environment    # package.module:factory, imported and called: returns an Environment
    desk                           # a name under the entry-point group `evergreen.environments`: installed
                                   # packages' metadata, and this project's own pyproject.toml (so that a
                                   # checkout works before it is installed)
    include/envs/desk_mcp.yaml     # a YAML spec (tasks/envs/spec.py): a base environment or a task file,
                                   # a verifier, and the MCP / HTTP server that answers the calls; no Python

The core never names an environment: desk, the embedded default, is found like any team's (its entry
point is in pyproject.toml; tests/unit/envs/test_plugins.py greps the core for the name).
"""

from __future__ import annotations

import importlib
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.envs.base import Episode, Task, ToolSession, Verifier
from tasks.envs.toolset import load_toolset

if TYPE_CHECKING:
    from tasks.policy.chat import ChatFormat

GROUP = "evergreen.environments"
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


@dataclass(frozen=True)
class Environment:
    """What the loop needs of an environment.

    generate_tasks(n, seed, toolset=None, split=None) -> list[Task]: deterministic in seed; toolset is
        load_toolset's {version, tools}, None for the environment's own choice (desk: random schemas);
        split "train" / "dev" / "eval" keeps content apart (None: any, as production traffic).
    open_session(task) -> ToolSession: what answers the episode's calls (tasks.envs.backends).
    verify(episode) -> {"reward" in [0, 1], "components", "reason", "success", ...}: the episode's score.
    demonstration(task, rng) -> list of assistant messages (a call, then the answer), or None when the
        environment has no expert: the bootstrap then needs a model that already calls tools.
    toolset_dir: where its shipped toolset versions live (registry_v{N}.json), or None.
    task_from_trace(trace, toolset) -> Task | None: a production trace (include/schemas/trace.schema.json)
        as a task of this environment that its verifier can score, on `toolset`; None where it cannot
        verify one (tasks from production: tasks/signals/production_tasks.py).
    """

    name: str
    generate_tasks: Callable[..., list[Task]]
    open_session: Callable[[Task], ToolSession]
    verify: Verifier
    demonstration: Callable | None = None
    toolset_dir: Path | None = None
    task_from_trace: Callable[[dict, dict], Task | None] | None = None

    def load_toolset(self, source: str | Path | dict | list) -> dict:
        """tasks.envs.toolset.load_toolset with this environment's shipped versions."""
        return load_toolset(source, self.name)


def _registered() -> dict[str, str]:
    """Entry points of the group: this project's pyproject.toml first, installed packages over it."""
    found = {}
    if PYPROJECT.is_file():
        project = tomllib.loads(PYPROJECT.read_text()).get("project", {})
        found.update(project.get("entry-points", {}).get(GROUP, {}))
    found.update({ep.name: ep.value for ep in entry_points(group=GROUP)})
    return found


@cache
def get_env(name: str) -> Environment:
    """The environment `name` names (a spec file, module:factory or an entry point); errors say what to change."""
    if name.endswith((".yaml", ".yml")):
        from tasks.envs.spec import load_spec

        path = Path(name)
        return load_spec(path if path.is_absolute() else PYPROJECT.parent / path)
    target = name if ":" in name else _registered().get(name)
    if target is None:
        raise KeyError(
            f"env.name={name!r}: no environment of that name; registered ({GROUP}): "
            f"{sorted(_registered())}; or give package.module:factory"
        )
    module_name, _, attr = target.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ImportError(
            f"env.name={name!r}: cannot load {target} ({type(e).__name__}: {e}); fix the module or the entry point"
        ) from None
    env = factory() if callable(factory) and not isinstance(factory, Environment) else factory
    if not isinstance(env, Environment):
        raise TypeError(f"env.name={name!r}: {target} gave {type(env).__name__}, not tasks.envs.Environment")
    return env


def new_episode(task: Task, chat: ChatFormat, **limits: Any) -> Episode:
    """An episode of `task` with its environment's tool session and verifier."""
    env = get_env(task.env)
    return Episode(task, chat, env.open_session(task), env.verify, **limits)
