"""`python -m tasks` on bad input: no traceback, one message naming what to fix, exit 2 (tasks/__main__.py,
tasks/config.py, tasks/signals/cli.py). Hypothesis feeds random tool registries and settings files;
the named cases are the ones an audit found raising tracebacks.

    PYTHONPATH=. .venv/bin/python -m pytest -q tests/unit/test_cli_bad_input.py
"""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tasks.__main__ import main

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
SCHEMA_WORDS = st.sampled_from(
    ["type", "properties", "required", "items", "enum", "anyOf", "minimum", "additionalProperties"]
)
SCHEMA = st.recursive(JSON, lambda inner: st.dictionaries(SCHEMA_WORDS, inner, max_size=4), max_leaves=10)
TOOL = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": st.text(max_size=10) | st.integers(), "parameters": SCHEMA}, optional={"description": JSON}
        ),
    }
)
REGISTRY = JSON | st.fixed_dictionaries({"version": JSON, "tools": st.lists(TOOL | JSON, max_size=3)})
SECTIONS = st.sampled_from(["grpo", "rollout", "eval", "env", "promotion", "model", "tracking", "ray", "nonsense"])
FIELDS = st.sampled_from(["steps", "lr", "group_size", "num_tasks", "name", "uri", "min_gain", "seed", "typo"])
CONFIG = JSON | st.dictionaries(SECTIONS, JSON | st.dictionaries(FIELDS, JSON, max_size=3), max_size=3)


def run(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def assert_clean(code: int, err: str) -> None:
    assert code in (0, 2), (code, err[-2000:])
    assert "Traceback" not in err, err[-2000:]
    if code == 2:
        assert err.strip(), "exit 2 must say why"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=REGISTRY)
def test_random_registries_are_diffed_or_refused_in_one_message(doc, tmp_path, capsys):
    path = tmp_path / "registry.json"
    path.write_text(json.dumps(doc))
    assert_clean(*run(["tooldiff", "1", str(path)], capsys))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=CONFIG, raw=st.booleans(), text=st.text(max_size=40))
def test_random_settings_files_load_or_are_refused_in_one_message(doc, raw, text, tmp_path, capsys):
    path = tmp_path / "pipeline.yaml"
    path.write_text(text if raw else yaml.safe_dump(doc))
    assert_clean(*run(["--config", str(path), "settings"], capsys))


@pytest.mark.parametrize(
    "case",
    [
        "required_5",
        "type_5",
        "description_object",
        "registry_is_dir",
        "yaml_syntax",
        "yaml_list",
        "config_is_dir",
        "output_is_file",
        "set_section",
        "set_without_equals",
    ],
)
def test_the_audits_bad_inputs_exit_2_without_a_traceback(case, tmp_path, capsys):
    def tool(parameters, **more) -> str:  # a file per case: the table below builds every case's file
        path = tmp_path / f"reg-{len(list(tmp_path.glob('reg-*')))}.json"
        path.write_text(
            json.dumps(
                {
                    "version": "x",
                    "tools": [{"type": "function", "function": {"name": "f", "parameters": parameters, **more}}],
                }
            )
        )
        return str(path)

    (tmp_path / "afile").write_text("")
    (tmp_path / "syntax.yaml").write_text("grpo: [1, 2\n")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    argv, said = {
        "required_5": (["tooldiff", "1", tool({"type": "object", "required": 5})], "not a valid JSON Schema"),
        "type_5": (["tooldiff", "1", tool({"type": 5})], "not a valid JSON Schema"),
        # what the hypothesis test found first (difflib raised KeyError on a dict description)
        "description_object": (["tooldiff", "1", tool({}, description={"": None})], "'description' must be text"),
        "registry_is_dir": (["tooldiff", "1", str(tmp_path)], "is a directory"),
        "yaml_syntax": (["--config", str(tmp_path / "syntax.yaml"), "settings"], "not valid YAML at line 2"),
        "yaml_list": (["--config", str(tmp_path / "list.yaml"), "settings"], "top level is a list"),
        "config_is_dir": (["--config", str(tmp_path), "settings"], "is not a file"),
        "output_is_file": (
            ["ingest", "--input", str(tmp_path / "afile"), "--output", str(tmp_path / "afile")],
            "is a file; give a directory",
        ),
        "set_section": (["--set", "grpo=5", "settings"], "grpo"),
        "set_without_equals": (["--set", "grpo", "settings"], "SECTION.FIELD=VALUE"),
    }[case]
    code, err = run(argv, capsys)
    assert code == 2 and "Traceback" not in err and said in err, err
