"""Toolset loading, hashing and diffing (tasks/envs/toolset.py and openapi.py, tasks/signals/toolset_hash.py
and tooldiff.py)."""

import copy
import json

import pytest
import yaml

from tasks.envs.toolset import load_toolset, toolset_of_model
from tasks.signals.tooldiff import BREAKING, NON_BREAKING, diff_toolsets
from tasks.signals.toolset_hash import normalise_tool, schema_hash


def _tool(name, description, properties, required=()):
    return {
        "type": "function",
        "x-evergreen-handler": name,
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": list(required)},
        },
    }


BASE = {
    "version": "1",
    "tools": [
        _tool(
            "search",
            "Search the document store.",
            {
                "query": {"type": "string", "description": "what to look for"},
                "limit": {"type": "integer"},
                "mode": {"type": "string", "enum": ["fast", "exact"]},
                "filters": {
                    "type": "object",
                    "properties": {"tags": {"type": "array", "items": {"type": "string"}}, "year": {"type": "integer"}},
                    "required": ["year"],
                },
            },
            required=["query"],
        ),
        _tool("fetch", "Fetch one document by id.", {"id": {"type": "string"}}, required=["id"]),
    ],
}
TRANSLATE = _tool("translate", "Translate text into another language.", {"text": {"type": "string"}}, ["text"])


def F(reg, name):
    return next(t["function"] for t in reg["tools"] if t["function"]["name"] == name)


def P(reg, name):
    return F(reg, name)["parameters"]["properties"]


def R(reg, name):
    return F(reg, name)["parameters"]["required"]


def _rename_param(reg, tool, old, new):
    props = P(reg, tool)
    renamed = {new if k == old else k: v for k, v in props.items()}
    props.clear()
    props.update(renamed)
    req = R(reg, tool)
    req[:] = [new if r == old else r for r in req]


# (id, mutation of a copy of BASE, expected [(change, kind, tool, parameter)] in order)
CASES = [
    ("tool_removed", lambda r: r["tools"].pop(1), [("tool_removed", BREAKING, "fetch", None)]),
    (
        "tool_added",
        lambda r: r["tools"].append(copy.deepcopy(TRANSLATE)),
        [("tool_added", NON_BREAKING, "translate", None)],
    ),
    (
        "tool_renamed_same_parameters",
        lambda r: F(r, "fetch").update(name="get_document", description="Get one."),
        [("tool_renamed", BREAKING, "fetch", None), ("description_changed", NON_BREAKING, "fetch", None)],
    ),
    (
        "tool_renamed_same_description",
        lambda r: [_rename_param(r, "fetch", "id", "doc_id"), F(r, "fetch").update(name="retrieve")],
        [("tool_renamed", BREAKING, "fetch", None), ("parameter_renamed", BREAKING, "fetch", "id")],
    ),
    (
        "unrelated_tools_are_not_a_rename",
        lambda r: r["tools"].__setitem__(1, copy.deepcopy(TRANSLATE)),
        [("tool_removed", BREAKING, "fetch", None), ("tool_added", NON_BREAKING, "translate", None)],
    ),
    (
        "required_parameter_added",
        lambda r: [P(r, "fetch").update(lang={"type": "string"}), R(r, "fetch").append("lang")],
        [("required_parameter_added", BREAKING, "fetch", "lang")],
    ),
    (
        "optional_parameter_added",
        lambda r: P(r, "fetch").update(lang={"type": "string"}),
        [("optional_parameter_added", NON_BREAKING, "fetch", "lang")],
    ),
    (
        "required_parameter_removed",
        lambda r: [P(r, "fetch").pop("id"), R(r, "fetch").clear()],
        [("parameter_removed", BREAKING, "fetch", "id")],
    ),
    # decision: the trained model keeps sending an optional parameter, so removing one breaks too
    (
        "optional_parameter_removed",
        lambda r: P(r, "search").pop("limit"),
        [("parameter_removed", BREAKING, "search", "limit")],
    ),
    (
        "parameter_renamed",
        lambda r: _rename_param(r, "search", "query", "q"),
        [("parameter_renamed", BREAKING, "search", "query")],
    ),
    (
        "type_changed",
        lambda r: P(r, "search")["limit"].update(type="string"),
        [("type_changed", BREAKING, "search", "limit")],
    ),
    (
        "nested_property_type_changed",
        lambda r: P(r, "search")["filters"]["properties"]["year"].update(type="string"),
        [("type_changed", BREAKING, "search", "filters.year")],
    ),
    (
        "nested_items_type_changed",
        lambda r: P(r, "search")["filters"]["properties"]["tags"]["items"].update(type="integer"),
        [("type_changed", BREAKING, "search", "filters.tags[]")],
    ),
    # decision: every integer is a valid number, so integer -> number accepts all old calls
    (
        "integer_widened_to_number",
        lambda r: P(r, "search")["limit"].update(type="number"),
        [("type_changed", NON_BREAKING, "search", "limit")],
    ),
    (
        "type_gains_null",
        lambda r: P(r, "search")["query"].update(type=["string", "null"]),
        [("type_changed", NON_BREAKING, "search", "query")],
    ),
    (
        "number_narrowed_to_integer",
        lambda r: P(r, "fetch")["id"].update(type="integer"),
        [("type_changed", BREAKING, "fetch", "id")],
    ),
    (
        "enum_value_removed",
        lambda r: P(r, "search")["mode"].update(enum=["fast"]),
        [("enum_narrowed", BREAKING, "search", "mode")],
    ),
    (
        "enum_added_to_free_parameter",
        lambda r: P(r, "fetch")["id"].update(enum=["a", "b"]),
        [("enum_narrowed", BREAKING, "fetch", "id")],
    ),
    (
        "enum_value_added",
        lambda r: P(r, "search")["mode"].update(enum=["fast", "exact", "fuzzy"]),
        [("enum_widened", NON_BREAKING, "search", "mode")],
    ),
    ("enum_dropped", lambda r: P(r, "search")["mode"].pop("enum"), [("enum_widened", NON_BREAKING, "search", "mode")]),
    (
        "parameter_made_required",
        lambda r: R(r, "search").append("limit"),
        [("parameter_made_required", BREAKING, "search", "limit")],
    ),
    (
        "parameter_made_optional",
        lambda r: R(r, "search").clear(),
        [("parameter_made_optional", NON_BREAKING, "search", "query")],
    ),
    (
        "nested_parameter_made_optional",
        lambda r: P(r, "search")["filters"].pop("required"),
        [("parameter_made_optional", NON_BREAKING, "search", "filters.year")],
    ),
    (
        "tool_description_changed",
        lambda r: F(r, "search").update(description="Full-text search."),
        [("description_changed", NON_BREAKING, "search", None)],
    ),
    (
        "parameter_description_changed",
        lambda r: P(r, "search")["query"].update(description="search terms"),
        [("description_changed", NON_BREAKING, "search", "query")],
    ),
    ("handler_binding_is_not_a_change", lambda r: r["tools"][0].update({"x-evergreen-handler": "other"}), []),
]


@pytest.mark.parametrize("mutate,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_change_class_is_detected(mutate, expected):
    new = copy.deepcopy(BASE)
    mutate(new)
    diff = diff_toolsets(BASE, new)
    assert [(c.change, c.kind, c.tool, c.parameter) for c in diff.changes] == expected
    assert diff.breaking == any(kind == BREAKING for _, kind, _, _ in expected)
    assert (diff.old_hash == diff.new_hash) == (expected == [])


def test_rename_reason_is_reported():
    new = copy.deepcopy(BASE)
    F(new, "fetch")["name"] = "get_document"
    (change,) = diff_toolsets(BASE, new).changes
    assert change.detail == "tool renamed fetch -> get_document (same parameters)"


def test_shipped_v1_to_v2_renames_tools_and_arguments_and_retypes_operands():
    diff = diff_toolsets("1", "2")
    assert diff.breaking
    got = {(c.change, c.tool, c.parameter): c.detail for c in diff.changes}
    renamed_tools = {d for (change, _, _), d in got.items() if change == "tool_renamed"}
    assert {d.split(" (")[0] for d in renamed_tools} == {
        "tool renamed calculator -> calculate",
        "tool renamed convert -> convert_units",
        "tool renamed lookup -> city_facts",
    }
    renamed_args = sorted(d.split(": ")[1] for (change, _, _), d in got.items() if change == "parameter_renamed")
    assert renamed_args == sorted(
        [
            "parameter renamed a -> x",
            "parameter renamed b -> y",
            "parameter renamed op -> operator",
            "parameter renamed value -> quantity",
            "parameter renamed from_unit -> source",
            "parameter renamed to_unit -> target",
            "parameter renamed city -> name",
            "parameter renamed field -> attribute",
        ]
    )
    assert got[("type_changed", "calculator", "a")] == "calculator.a: type changed integer -> string"
    assert ("type_changed", "calculator", "b") in got
    assert not {c.change for c in diff.changes} & {"tool_removed", "tool_added", "parameter_removed"}
    out = diff.to_dict()
    assert json.loads(json.dumps(out)) == out
    assert out["summary"].startswith("13 breaking changes: tool renamed calculator -> calculate")
    assert out["counts"] == {"breaking": 13, "non_breaking": 3}


def test_shipped_v1_against_itself_has_no_changes():
    diff = diff_toolsets("1", "v1")
    assert diff.changes == [] and not diff.breaking
    assert diff.old_hash == diff.new_hash == schema_hash(load_toolset("1"))
    assert diff.to_dict()["summary"] == "no changes"


def _reversed_keys(node):
    if isinstance(node, dict):
        return {k: _reversed_keys(node[k]) for k in reversed(list(node))}
    return [_reversed_keys(v) for v in node] if isinstance(node, list) else node


def test_hash_is_stable_under_layout_and_order(tmp_path):
    compact, pretty = tmp_path / "a.json", tmp_path / "b.json"
    compact.write_text(json.dumps(BASE, separators=(",", ":")))
    shuffled = _reversed_keys(BASE)
    shuffled["tools"].reverse()
    shuffled["version"] = "another label"  # the label is not part of the schema hash
    for tool in shuffled["tools"]:
        tool["function"]["parameters"]["required"].reverse()
    F(shuffled, "search")["parameters"]["required"].append("limit")
    F(shuffled, "search")["parameters"]["required"].reverse()
    R(shuffled, "search").remove("limit")
    P(shuffled, "search")["mode"]["enum"].reverse()
    pretty.write_text(json.dumps(shuffled, indent=7))
    assert schema_hash(compact) == schema_hash(pretty) == schema_hash(BASE)
    assert schema_hash(BASE).startswith("sha256:") and len(schema_hash(BASE)) == 7 + 64


def test_hash_changes_with_a_description_or_a_required_flag():
    edited = copy.deepcopy(BASE)
    F(edited, "fetch")["description"] += " Fast."
    required = copy.deepcopy(BASE)
    R(required, "fetch").clear()
    assert len({schema_hash(BASE), schema_hash(edited), schema_hash(required)}) == 3


def test_normalise_tool_keeps_only_schema_parts():
    tool = {
        "type": "function",
        "x-evergreen-handler": "calc",
        "function": {
            "name": "calc",
            "strict": True,
            "parameters": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"a": {"type": ["null", "integer"], "x-unit": "m", "enum": [3, 1], "format": "int32"}},
                "required": ["a", "a"],
            },
        },
    }
    assert normalise_tool(tool) == {
        "name": "calc",
        "description": "",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": ["integer", "null"], "enum": [1, 3]}},
            "required": ["a"],
        },
    }
    assert normalise_tool({"name": "ping"}) == {
        "name": "ping",
        "description": "",
        "parameters": {"type": "object", "properties": {}, "required": []},
    }


OPENAPI = {
    "openapi": "3.0.3",
    "info": {"title": "Docs", "version": "1.4.0"},
    "paths": {
        "/documents": {
            "get": {
                "operationId": "listDocuments",
                "summary": "List documents.",
                "parameters": [
                    {"name": "limit", "in": "query", "schema": {"type": "integer"}, "description": "page size"},
                    {"name": "session", "in": "cookie", "schema": {"type": "string"}},
                    {"$ref": "#/components/parameters/Tenant"},
                ],
            },
            "post": {
                "operationId": "createDocument",
                "description": "Create a document.",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NewDocument"}}},
                },
            },
            "delete": {"summary": "no operationId: not offered"},
        },
        "/documents/{doc_id}": {
            "parameters": [{"name": "doc_id", "in": "path", "schema": {"type": "string"}}],
            "get": {"operationId": "getDocument", "summary": "Get a document."},
        },
    },
    "components": {
        "parameters": {"Tenant": {"name": "X-Tenant", "in": "header", "required": True, "schema": {"type": "string"}}},
        "schemas": {
            "NewDocument": {
                "type": "object",
                "required": ["title"],
                "properties": {"title": {"type": "string"}, "author": {"$ref": "#/components/schemas/Person"}},
            },
            "Person": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "manager": {"$ref": "#/components/schemas/Person"}},
            },
        },
    },
}  # recursive: needs the cycle guard


def test_openapi_operations_become_function_tools():
    reg = load_toolset(OPENAPI)
    assert reg["version"] == "1.4.0"
    assert [t["function"]["name"] for t in reg["tools"]] == ["listDocuments", "createDocument", "getDocument"]
    assert F(reg, "listDocuments") == {
        "name": "listDocuments",
        "description": "List documents.",
        "parameters": {
            "type": "object",
            "required": ["X-Tenant"],
            "properties": {"limit": {"type": "integer", "description": "page size"}, "X-Tenant": {"type": "string"}},
        },
    }
    create = F(reg, "createDocument")
    assert create["description"] == "Create a document."
    assert create["parameters"]["required"] == ["title"]
    author = create["parameters"]["properties"]["author"]
    assert author["properties"]["name"] == {"type": "string"}
    assert author["properties"]["manager"] == {"type": "object"}  # Person -> manager: Person, cycle stopped
    assert F(reg, "getDocument")["parameters"] == {
        "type": "object",
        "properties": {"doc_id": {"type": "string"}},
        "required": ["doc_id"],
    }


def test_openapi_versions_diff_finds_a_breaking_change(tmp_path):
    v2 = copy.deepcopy(OPENAPI)
    v2["components"]["schemas"]["NewDocument"]["required"].append("author")
    v2["paths"]["/documents"]["get"]["parameters"][0]["schema"]["type"] = "number"
    path = tmp_path / "api-v2.yaml"
    path.write_text(yaml.safe_dump(v2))
    diff = diff_toolsets(OPENAPI, path)
    assert [(c.change, c.kind, c.tool, c.parameter) for c in diff.changes] == [
        ("type_changed", NON_BREAKING, "listDocuments", "limit"),
        ("parameter_made_required", BREAKING, "createDocument", "author"),
    ]
    assert diff.breaking


def test_load_json_yaml_and_suffixless_files(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps(BASE, indent=2))
    (tmp_path / "r.yml").write_text(yaml.safe_dump(BASE))
    (tmp_path / "registry").write_text(json.dumps(BASE))
    hashes = {schema_hash(load_toolset(tmp_path / name)) for name in ("r.json", "r.yml", "registry")}
    assert hashes == {schema_hash(BASE)}
    assert load_toolset(str(tmp_path / "r.yml"))["tools"][1]["function"]["name"] == "fetch"


def test_load_list_of_tools_and_shipped_version():
    assert schema_hash(BASE["tools"]) == schema_hash(BASE)
    assert [t["function"]["name"] for t in load_toolset("2")["tools"]] == ["calculate", "convert_units", "city_facts"]


@pytest.mark.parametrize(
    "name,text,message",
    [
        ("bad.json", '{"tools": [', "invalid JSON"),
        ("bad.yaml", "tools: [a, b\n", "invalid YAML/JSON"),
        ("empty.json", "  \n", "empty document"),
        ("list.json", "[1, 2]", "top level is a list"),
        ("nolist.json", '{"version": 1}', "no 'tools' list; expected {version, tools:[...]} or an OpenAPI document"),
        (
            "noname.json",
            '{"tools": [{"type": "function", "function": {"description": "x"}}]}',
            "tools[0] has no function name",
        ),
        (
            "params.json",
            '{"tools": [{"function": {"name": "f", "parameters": []}}]}',
            "'parameters' must be a JSON schema",
        ),
        ("dup.json", json.dumps({"tools": [TRANSLATE, TRANSLATE]}), "tool name 'translate' appears twice"),
        ("swagger.json", '{"swagger": "2.0", "paths": {}}', "Swagger 2.0 is not supported"),
        ("noops.json", '{"openapi": "3.0.0", "paths": {"/a": {"get": {}}}}', "no operations with an operationId"),
        (
            "extref.json",
            json.dumps(
                {
                    "openapi": "3.1.0",
                    "paths": {"/a": {"get": {"operationId": "a", "parameters": [{"$ref": "other.yaml#/P"}]}}},
                }
            ),
            "points outside the document",
        ),
        (
            "dangling.json",
            json.dumps(
                {
                    "openapi": "3.1.0",
                    "paths": {
                        "/a": {"get": {"operationId": "a", "parameters": [{"$ref": "#/components/parameters/Nope"}]}}
                    },
                }
            ),
            "points nowhere",
        ),
    ],
)
def test_malformed_sources_name_the_source_and_the_problem(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError) as e:
        load_toolset(path)
    assert f"registry {path}" in str(e.value) and message in str(e.value)


def test_missing_sources(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_toolset(tmp_path / "absent.json")
    with pytest.raises(FileNotFoundError, match="registry_v9"):
        load_toolset("9")
    with pytest.raises(IsADirectoryError, match="toolset_of_model"):
        load_toolset(tmp_path)


def test_toolset_of_model(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        toolset_of_model(tmp_path)
    assert str(tmp_path / "tool_registry.json") in str(e.value) and "beside its weights" in str(e.value)
    (tmp_path / "tool_registry.json").write_text(json.dumps(BASE))
    assert diff_toolsets(toolset_of_model(tmp_path), BASE).changes == []


def test_summary_lists_breaking_changes_first():
    new = copy.deepcopy(BASE)
    F(new, "search")["description"] = "Changed."
    new["tools"].pop(1)
    d = diff_toolsets(BASE, new)
    assert d.summary == "1 breaking change: tool removed: fetch (+1 non-breaking)"
    only_docs = copy.deepcopy(BASE)
    F(only_docs, "search")["description"] = "Changed."
    assert diff_toolsets(BASE, only_docs).summary == "1 non-breaking change: search: description changed"


def test_openapi_document_served_by_the_tool_service_over_http():
    """The toolset can be the tool service's own /openapi.json (a real HTTP server on loopback)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    body = json.dumps(OPENAPI).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            found = self.path == "/openapi.json"
            self.send_response(200 if found else 404)
            self.end_headers()
            self.wfile.write(body if found else b"not found")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        assert load_toolset(f"{url}/openapi.json") == load_toolset(OPENAPI)
        with pytest.raises(FileNotFoundError, match="404"):
            load_toolset(f"{url}/missing.json")
    finally:
        server.shutdown()


def test_every_caller_reads_shipped_toolsets_through_the_one_loader():
    from tasks.envs import get_env
    from tasks.envs.desk import TOOLSET_DIR, toolset_tasks
    from tasks.envs.toolset import shipped_toolset_path

    env = get_env("desk")
    assert shipped_toolset_path("2") == env.toolset_dir / "registry_v2.json" == TOOLSET_DIR / "registry_v2.json"
    assert env.load_toolset("v2") == load_toolset("2") == json.loads((TOOLSET_DIR / "registry_v2.json").read_text())
    assert toolset_tasks("2", 3, 0)[0].tools[0]["function"]["name"] == "calculate"
    with pytest.raises(KeyError, match="no environment of that name"):
        load_toolset("2", env="gym")


def test_run_files_name_a_toolset_by_version_or_schema_hash_never_by_its_source():
    from tasks.envs.desk import TOOLSET_DIR
    from tasks.envs.toolset import toolset_label
    from tasks.signals.toolset_hash import schema_hash

    assert toolset_label("2") == toolset_label("v2") == "v2"
    by_file = toolset_label(str(TOOLSET_DIR / "registry_v2.json"), "desk")
    assert by_file == "ts-" + schema_hash("2", "desk").split(":")[1][:12]  # the tools, not where they came from
    assert "/" not in by_file and ":" not in by_file


def test_a_tool_whose_parameters_are_not_json_schema_is_refused_naming_it():
    tools = [
        {
            "type": "function",
            "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "integr"}}}},
        }
    ]
    with pytest.raises(ValueError, match=r"tools\[0\] \('f'\): 'parameters' is not a valid JSON Schema"):
        load_toolset({"version": "x", "tools": tools})
