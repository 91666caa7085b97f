"""The Evergreen page and plugin: summaries on a temporary runs_root, served through FastAPI's TestClient.

    PYTHONPATH=. python -m pytest -q tests/unit/plugins/test_evergreen_page.py

Summaries are RunSummary JSON (tasks.stages.contracts), rendered by autoescaped Jinja2 templates: escaped
text reads as markupsafe writes it (&#39; for ', &#34; for "). Two tests start a Python subprocess each (a
clean sys.modules, their own AIRFLOW_HOME): importing the plugin does no work and pulls in no heavy
library; airflow.plugins_manager loads it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from fastapi import HTTPException
from fastapi.testclient import TestClient

from plugins import evergreen_data
from plugins import evergreen_page as page

REPO = Path(__file__).resolve().parents[3]
PLUGINS = REPO / "plugins"
XSS = "<script>alert('x')</script>"


def _iv(mean: float, half: float = 0.05) -> dict:
    return {"mean": mean, "low": mean - half, "high": mean + half}


def _cmp(champ: dict, chall: dict, diff: dict) -> dict:
    return {"metric": "success_rate", "champion": champ, "challenger": chall, "difference": diff}


def _summary(run_id: str, started: str, status: str, **extra) -> dict:
    champ, chall = 0.41, 0.78 if status == "promoted" else 0.44
    s = {
        "dag_id": "continuous_post_training",
        "run_id": run_id,
        "run_dir": f"/runs/{run_id}",
        "started_at": started,
        "finished_at": started.replace("T03:", "T04:"),
        "status": status,
        "trigger": {
            "kind": "asset",
            "asset_events": [
                {"uri": "evergreen://signals/retrain_request", "extra": {"reasons": ["success dropped on desk"]}}
            ],
        },
        "signals": {
            "retrain": True,
            "reasons": ["tool registry changed"],
            "summary": "drift on desk",
            "window": "2026-12-02",
            "drift": [
                {
                    "workload": "desk",
                    "statistic": "success_rate",
                    "effect": -0.31,
                    "p_adjusted": 1e-9,
                    "significant": True,
                }
            ],
            "tooldiff": {"breaking": 3, "changes": ["get_weather: temperature now in kelvin"]},
        },
        "target_toolset": "2",
        "guard_toolsets": ["1"],
        "greedy": {
            "2": _cmp(_iv(champ), _iv(chall), _iv(chall - champ, 0.04)),
            "1": _cmp(_iv(0.9), _iv(0.88), _iv(-0.02, 0.03)),
        },
        "sampled": {"2": _cmp(_iv(0.36), _iv(0.70), _iv(0.34))},
        "promotion": {
            "decision": {
                "promote": status == "promoted",
                "summary": f"gate says {status}",
                "reasons": [f"target gain {100 * (chall - champ):.1f} pts"],
                "checks": [
                    {
                        "name": "target_gain",
                        "passed": status == "promoted",
                        "observed": chall - champ - 0.04,
                        "threshold": 0.05,
                        "unit": "fraction",
                        "reason": "lower bound vs min_gain",
                    }
                ],
            },
            "cost": {
                "run_usd": 0.046,
                "total_usd": 0.069,
                "success_gain_points": 100 * (chall - champ),
                "usd_per_success_point": 0.0012,
                "stages": [{"stage": "grpo", "wall_s": 301.0, "usd": 0.03}],
            },
            "version": "3",
            "aliases": {"champion": "3", "previous": "2"},
            "model_name": "evergreen-agent",
        },
        "champion_version": "2",
        "challenger_version": "3",
        "links": {
            "mlflow_run": "http://127.0.0.1:5000/#/experiments/1/runs/abc",
            "ray_dashboard": "http://127.0.0.1:8265",
            "ray_job_id": "raysubmit_42",
            "airflow_run": f"http://127.0.0.1:8080/dags/continuous_post_training/runs/{run_id}",
        },
        "timings": {"grpo": 301.0},
        "wall_s": 512.0,
    }
    s.update(extra)
    return s


def _write(root: Path, name: str, data) -> None:
    p = root / "continuous_post_training" / name / "summary.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(data if isinstance(data, str) else json.dumps(data))


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("EVERGREEN_RUN_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture
def client(root) -> TestClient:
    return TestClient(page.create_app())


@pytest.fixture
def four_runs(root) -> Path:
    """Oldest to newest: not promoted, skipped, promoted (with a <script> in a reason); plus a broken file."""
    _write(
        root,
        "scheduled_1",
        _summary(
            "scheduled__2026-12-01T03:00:00+00:00",
            "2026-12-01T03:00:00+00:00",
            "not_promoted",
            trigger={"kind": "schedule"},
        ),
    )
    _write(
        root,
        "rest_2",
        {
            "dag_id": "continuous_post_training",
            "run_id": "manual__2026-12-01T09:00:00+00:00",
            "run_dir": "/runs/rest_2",
            "target_toolset": "2",
            "status": "skipped",
            "started_at": "2026-12-01T09:00:00+00:00",
            "finished_at": "2026-12-01T09:01:00+00:00",
            "skip_reason": "no significant drift and no breaking tool change",
            "trigger": {"kind": "rest", "params": {"force": False}},
        },
    )
    promoted = _summary("asset_triggered__2026-12-02T03:00:00+00:00", "2026-12-02T03:00:00+00:00", "promoted")
    promoted["promotion"]["decision"]["reasons"].append(XSS)
    _write(root, "asset_3", promoted)
    _write(root, "broken_4", "{not json")
    return root


def _svg(text: str, id_: str) -> ET.Element:
    m = re.search(rf'<svg id="{id_}".*?</svg>', text, re.S)
    assert m, f"no <svg id={id_}>"
    return ET.fromstring(m.group(0))  # well-formed XML, or this raises


NS = "{http://www.w3.org/2000/svg}"


def test_empty_state(client):
    r = client.get("/")
    assert r.status_code == 200
    assert 'id="empty-state"' in r.text and 'id="last-decision"' not in r.text
    assert _svg(r.text, "success-chart").find(f"{NS}text").text == "no evaluated runs yet"
    assert _svg(r.text, "cost-chart") is not None and client.get("/api/runs").json()["count"] == 0
    assert client.get("/health").json() == {"status": "ok", "runs": 0, "errors": 0}


def test_newest_run_first_with_its_decision(client, four_runs):
    text = client.get("/").text
    order = [m for m in re.findall(r'<article class="run [^"]*" id="run-\d+" data-run-id="([^"]+)"', text)]
    assert order == [
        "asset_triggered__2026-12-02T03:00:00+00:00",
        "manual__2026-12-01T09:00:00+00:00",
        "scheduled__2026-12-01T03:00:00+00:00",
    ]
    last = re.search(r'<section id="last-decision".*?</section>', text, re.S).group(0)
    assert 'data-status="promoted"' in last and '<strong class="verdict">PROMOTED</strong>' in last
    assert "champion v2 → challenger v3" in last
    assert "gain per dollar: 536.2 pts/$" in last  # 100 * 0.37 / 0.069


def test_not_promoted_shows_reasons_and_failed_check(client, four_runs):
    text = client.get("/").text
    card = re.search(r'<article class="run not_promoted".*?</article>', text, re.S).group(0)
    assert '<span class="badge not_promoted">not promoted</span>' in card
    assert "<li>target gain 3.0 pts</li>" in card and "<li>get_weather: temperature now in kelvin</li>" in card
    assert '<tr class="fail"><td>target_gain</td><td>✗</td><td>-0.01</td><td>0.05</td><td>fraction</td>' in card
    assert 'Trigger: <strong class="trigger-kind">schedule</strong> (the nightly schedule)' in card
    assert "Tool registry diff: breaking changes: <strong>3</strong>" in card
    assert '<tr class="sig"><td>desk</td><td>success_rate</td><td>-0.31</td><td>1e-09</td><td>yes</td></tr>' in card


def test_skipped_run_says_why_and_shows_dashes(client, four_runs):
    card = re.search(r'<article class="run skipped".*?</article>', client.get("/").text, re.S).group(0)
    assert "Skipped: no significant drift and no breaking tool change" in card
    assert '<strong class="trigger-kind">rest</strong> (a REST API call)' in card
    assert "&#34;force&#34;: false" in card  # params, escaped JSON
    assert '<dd class="run-usd">' not in card and "<h3>Cost</h3><p>—</p>" in card
    assert '<span class="mlflow-link">—</span>' in card


def test_intervals_for_target_and_guard(client, four_runs):
    card = re.search(r'<article class="run promoted".*?</article>', client.get("/").text, re.S).group(0)
    target = re.search(r'<tr class="target greedy" data-registry="2".*?</tr>', card, re.S).group(0)
    for cell in (
        '41.0% <span class="ci">[36.0, 46.0]</span>',
        '78.0% <span class="ci">[73.0, 83.0]</span>',
        '+37.0 pts <span class="ci">[+33.0, +41.0]</span>',
    ):
        assert cell in target, cell
    guard = re.search(r'<tr class="guard greedy" data-registry="1".*?</tr>', card, re.S).group(0)
    assert '-2.0 pts <span class="ci">[-5.0, +1.0]</span>' in guard
    assert 'class="target sampled"' in card and 'class="guard sampled"' not in card  # only what was measured


def test_links(client, four_runs, root):
    card = re.search(r'<article class="run promoted".*?</article>', client.get("/").text, re.S).group(0)
    assert '<a href="http://127.0.0.1:5000/#/experiments/1/runs/abc" rel="noopener noreferrer">' in card
    assert '<a href="http://127.0.0.1:8265" rel="noopener noreferrer">' in card
    assert '<code class="ray-job-id">raysubmit_42</code>' in card
    assert (
        'href="http://127.0.0.1:8080/dags/continuous_post_training/runs/asset_triggered__2026-12-02T03:00:00+00:00"'
    ) in card
    # a path on the Airflow server is a link; javascript: and another site's //host are text only
    _write(
        root,
        "evil",
        _summary(
            "evil",
            "2026-12-03T03:00:00+00:00",
            "failed",
            links={
                "mlflow_run": "javascript:alert(1)",
                "ray_dashboard": "//evil.example/x",
                "airflow_run": "/dags/continuous_post_training/runs/evil",
            },
        ),
    )
    text = client.get("/").text
    assert 'href="javascript:' not in text and "<code>javascript:alert(1)</code>" in text
    assert 'href="//' not in text and "<code>//evil.example/x</code>" in text
    assert '<a href="/dags/continuous_post_training/runs/evil" rel="noopener noreferrer">' in text


def test_svg_charts(client, four_runs):
    text = client.get("/").text
    success = _svg(text, "success-chart")
    assert len(success.findall(f".//{NS}g[@class='point champion']")) == 2  # the skipped run has no evaluation
    assert len(success.findall(f".//{NS}g[@class='point challenger']")) == 2
    labels = {t.text for t in success.iter(f"{NS}text") if t.get("class") == "ver"}
    assert {"v2", "v3"} <= labels
    tips = [t.text for t in success.iter(f"{NS}title")]
    assert any("challenger v3 on run asset_triggered__2026-12-02T03:00:00+00:00: 78.0% [73.0, 83.0]" in t for t in tips)
    bars = _svg(text, "cost-chart").findall(f".//{NS}g[@data-run-id]")
    assert [b.get("class") for b in bars] == ["bar not_promoted", "bar promoted"]  # oldest left


def test_every_summary_string_is_escaped(client, four_runs, root):
    """Autoescaped templates: a <script> in any string, typed field or free-form dict, reaches the page as text."""
    hostile = _summary(
        'x"><img src=x onerror=alert(1)>',
        "2026-12-04T03:00:00+00:00",
        "skipped",
        skip_reason=XSS,
        champion_version=XSS,
        timings={XSS: 1.0},
        trigger={"kind": XSS, "asset_events": [{"uri": XSS, "extra": {XSS: XSS}}]},
    )
    hostile["signals"]["tooldiff"]["changes"] = [XSS]
    hostile["promotion"]["decision"]["checks"][0]["name"] = XSS
    _write(root, "hostile", hostile)
    r = client.get("/")
    assert "<script" not in r.text and "<img src=x" not in r.text
    escaped = "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"
    assert 'data-run-id="x&#34;&gt;&lt;img src=x onerror=alert(1)&gt;"' in r.text
    last = re.search(r'<section id="last-decision".*?</section>', r.text, re.S).group(0)
    assert f"<li>{escaped}</li>" in last and f"champion v{escaped}" in last  # the skip reason, the version
    assert f'<p class="skip-reason">Skipped: {escaped}</p>' in r.text
    assert f"<tr><td>{escaped}</td><td>1.0 s</td></tr>" in r.text and f"<td>{escaped}</td><td>✗</td>" in r.text
    _svg(r.text, "success-chart")  # an escaped version label still leaves well-formed SVG
    csp = r.headers["content-security-policy"]  # default-src 'none' and no script-src: no script runs at all
    assert csp.startswith("default-src 'none'") and "script-src" not in csp
    assert "html.escape" not in (PLUGINS / "evergreen_page.py").read_text()  # no hand escaping left


REQUIRED = {
    "dag_id": "continuous_post_training",
    "run_dir": "/runs/x",
    "finished_at": "2026-12-03T04:00:00+00:00",
    "target_toolset": "2",
}


def test_unreadable_summaries_are_rows_not_a_crash(client, four_runs, root):
    _write(root, "no_status", {"dag_id": "continuous_post_training", "run_id": "r"})
    _write(root, "a_list", [1, 2])
    _write(root, "empty_id", {**REQUIRED, "run_id": "", "status": "failed"})
    # valid JSON with every required key, but not a RunSummary
    _write(
        root,
        "bad_types",
        {
            **REQUIRED,
            "run_id": "bad-types",
            "status": "exploded",
            "greedy": "not a dict",
            "trigger": None,
            "timings": {"grpo": "slow"},
        },
    )
    r = client.get("/")
    assert r.status_code == 200 and 'data-run-id="bad-types"' not in r.text
    assert len(re.findall(r'<article class="run ', r.text)) == 3  # the readable runs are all still there
    errors = re.search(r'<section id="errors".*?</section>', r.text, re.S).group(0)  # one row per file
    rows = {k.split("/")[1]: v for k, v in re.findall(r'class="unreadable"><code>([^<]+)</code>: (.*)</li>', errors)}
    assert rows["broken_4"].startswith("JSONDecodeError") and "a JSON list, not an object" in rows["a_list"]
    assert "status: Field required" in rows["no_status"] and "run_id must not be empty" in rows["empty_id"]
    assert rows["bad_types"].startswith("not a valid RunSummary: ")
    for field in ("status: Input should be", "greedy: Input should be a valid dictionary", "trigger:", "timings.grpo:"):
        assert field in rows["bad_types"], (field, rows["bad_types"])
    assert client.get("/health").json() == {"status": "ok", "runs": 3, "errors": 5}


def test_minimal_summary_renders_with_dashes(client, root):
    _write(
        root,
        "min",
        {**REQUIRED, "run_id": "only-required", "status": "failed", "promotion": {"cost": {"run_usd": "cheap"}}},
    )
    text = client.get("/").text
    assert '<strong class="verdict">failed</strong>' in text
    assert 'Trigger: <strong class="trigger-kind">—</strong>' in text
    assert "<h3>Success</h3><p>no evaluation</p>" in text and '<dd class="run-usd">—</dd>' in text
    assert "no priced runs yet" in text and "no evaluated runs yet" in text and "None" not in text


def test_json_endpoint(client, four_runs):
    data = client.get("/api/runs").json()
    assert data["dag_id"] == "continuous_post_training" and data["runs_root"] == str(four_runs.resolve())
    assert data["count"] == 3 and [r["summary"]["status"] for r in data["runs"]] == [
        "promoted",
        "skipped",
        "not_promoted",
    ]
    newest = data["runs"][0]
    assert newest["run_dir"] == "asset_3" and newest["gain_per_dollar"] == pytest.approx(100 * 0.37 / 0.069)
    assert newest["summary"]["promotion"]["decision"]["reasons"][-1] == XSS  # JSON is data: unescaped, typed
    assert [e["path"] for e in data["errors"]] == ["continuous_post_training/broken_4/summary.json"]


def test_nan_and_deep_nesting_do_not_break_the_json(client, root):
    s = _summary("nan", "2026-12-03T03:00:00+00:00", "not_promoted")
    s["signals"]["drift"][0]["effect"] = float("nan")
    _write(root, "nan", json.dumps(s))  # Python's json writes NaN, which strict JSON encoders refuse
    _write(root, "deep", "[" * 100_000 + "]" * 100_000)
    data = client.get("/api/runs").json()
    assert data["runs"][0]["summary"]["signals"]["drift"][0]["effect"] is None
    assert [e["path"] for e in data["errors"]] == ["continuous_post_training/deep/summary.json"]
    assert "<td>desk</td><td>success_rate</td><td>—</td>" in client.get("/").text


def test_drift_verdicts_and_breaking_flag_as_the_pipeline_writes_them(client, root):
    s = _summary("real", "2026-12-03T03:00:00+00:00", "failed", greedy=None, sampled=None, promotion=None)
    s["signals"]["drift"] = [
        {
            "workload": "calc",
            "statistic": "turns",
            "effect": None,
            "p_adjusted": None,
            "significant": None,
            "verdict": "insufficient_data",
        }
    ]
    s["signals"]["tooldiff"]["breaking"] = True
    _write(root, "real", s)
    text = client.get("/").text
    assert "<th>verdict</th>" in text and "<td>—</td><td>—</td><td>—</td><td>insufficient_data</td>" in text
    assert "breaking changes: <strong>yes</strong>" in text


def test_new_runs_appear_without_restart(client, root):
    assert client.get("/api/runs").json()["count"] == 0
    _write(root, "later", _summary("later", "2026-12-05T03:00:00+00:00", "promoted"))
    assert client.get("/api/runs").json()["count"] == 1
    assert 'data-run-id="later"' in client.get("/").text


def test_runs_root_follows_env_and_settings(monkeypatch):
    from tasks.config import load_settings

    monkeypatch.delenv("EVERGREEN_RUN_DIR", raising=False)
    assert evergreen_data.runs_root() == Path(load_settings().run_dir).resolve()
    monkeypatch.setenv("EVERGREEN_RUN_DIR", "runs/elsewhere")  # relative: to the project, as tasks/ reads it
    assert evergreen_data.runs_root() == (REPO / "runs" / "elsewhere").resolve()


def test_auth_hook_guards_page_and_api_not_health(root):
    def refusing(status: int, detail: str):
        async def auth(request):
            raise HTTPException(status_code=status, detail=detail)

        return auth

    deny, forbid = refusing(401, "Not authenticated"), refusing(403, "Invalid JWT token")

    login = lambda request: "/auth/login?next=" + str(request.url.path)  # noqa: E731
    c = TestClient(page.create_app(auth=deny, login_url=login), follow_redirects=False)
    r = c.get("/")
    assert r.status_code == 303 and r.headers["location"] == "/auth/login?next=/"
    assert c.get("/api/runs").status_code == 401
    assert c.get("/health").status_code == 200 and c.get("/icon.svg").status_code == 200
    c = TestClient(page.create_app(auth=forbid, login_url=login), follow_redirects=False)
    r = c.get("/")
    assert r.status_code == 403 and "Invalid JWT token" in r.text and 'href="/auth/login?next=/"' in r.text
    assert r.headers["content-security-policy"] == page.CSP
    assert c.get("/static/evergreen.css").status_code == 200  # the stylesheet holds no run data


def _run(code: str, tmp_path: Path) -> dict:
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "PYTHONPATH": str(REPO),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_plugin_import_is_light(tmp_path):
    got = _run(
        "import sys, json\n"
        "import plugins.evergreen_plugin as m\n"
        "app = m.EvergreenPlugin.fastapi_apps[0]['app']\n"
        "heavy = [n for n in ('torch', 'ray', 'mlflow', 'great_expectations', 'vllm', 'transformers', "
        "'tasks') if n in sys.modules]\n"
        "env_built = sys.modules[m.create_airflow_app.__module__].environment.cache_info().currsize\n"
        "print(json.dumps({'heavy': heavy, 'env_built': env_built,\n"
        "                  'routes': sorted(r.path for r in app.routes)}))",
        tmp_path,
    )
    assert got["heavy"] == [] and got["env_built"] == 0  # no work at import: templates load on the first page
    assert got["routes"] == ["/", "/api/runs", "/health", "/icon.svg", "/static", "/timeline.png"]


def test_airflow_plugins_manager_loads_the_plugin(tmp_path):
    got = _run(
        "import json\n"
        "from airflow import plugins_manager as pm\n"
        "from airflow.api_fastapi.core_api.datamodels.plugins import PluginResponse\n"
        "plugins, errors = pm._get_plugins()\n"
        "apps, _ = pm.get_fastapi_plugins()\n"
        "views, _ = pm._get_ui_plugins()\n"
        "info = [PluginResponse.model_validate(p).model_dump(mode='json') for p in pm.get_plugin_info()]\n"
        "print(json.dumps({'names': [p.name for p in plugins], 'errors': errors,\n"
        "  'apps': [(a['name'], a['url_prefix'], type(a['app']).__name__) for a in apps],\n"
        "  'views': views, 'info_views': [v for p in info for v in p['external_views']]}))",
        tmp_path,
    )
    assert got["errors"] == {}
    assert "evergreen" in got["names"]
    assert ["Evergreen", "/evergreen", "FastAPI"] in got["apps"]
    view = next(v for v in got["views"] if v["url_route"] == "evergreen")
    assert view["href"] == "/evergreen/" and view["destination"] == "nav" and view["nav_top_level"] is True
    # the /api/v2/plugins model the UI reads accepts it
    assert any(v["url_route"] == "evergreen" and v["href"] == "/evergreen/" for v in got["info_views"])


def test_training_figures_from_the_grpo_metrics(client, root, tmp_path):
    """The page shows the run's KL to the champion and the engine/trainer gap, token-weighted over steps
    (tasks.rl.metrics.training_digest, which `summarize` writes into the summary)."""
    from tasks.rl.metrics import metrics_digest

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        "".join(
            json.dumps(m) + "\n"
            for m in [
                {
                    "step": 1,
                    "reward_mean": 0.4,
                    "success_rate": 0.3,
                    "kl": 0.0,
                    "kl_tokens": 100,
                    "ratio_mean": 1.0,
                    "pg_tokens": 50,
                    "engine_logp_gap_mean": 1e-4,
                    "engine_logp_gap_max": 2e-3,
                    "engine_k3": 1e-8,
                    "engine_tokens": 60,
                    "trained_tokens": 100,
                },
                {
                    "step": 2,
                    "reward_mean": 0.6,
                    "success_rate": 0.5,
                    "kl": 0.03,
                    "kl_tokens": 300,
                    "ratio_mean": 1.0,
                    "pg_tokens": 150,
                    "engine_logp_gap_mean": 3e-4,
                    "engine_logp_gap_max": 1e-3,
                    "engine_k3": 3e-8,
                    "engine_tokens": 180,
                    "trained_tokens": 300,
                },
            ]
        )
    )
    digest = metrics_digest(metrics)
    assert digest["steps"] == 2 and digest["kl"] == pytest.approx(0.0225)  # (0 * 100 + 0.03 * 300) / 400
    assert digest["engine_logp_gap_mean"] == pytest.approx(2.5e-4) and digest["engine_logp_gap_max"] == 2e-3
    assert metrics_digest(tmp_path / "none.jsonl") == {"steps": 0}
    _write(root, "trained", _summary("trained", "2026-12-03T03:00:00+00:00", "promoted", training=digest))
    text = client.get("/").text
    assert '<dd class="kl">0.0225</dd>' in text and '<dd class="engine-gap">2.50e-04 / 2.00e-03</dd>' in text


def test_stylesheet_is_served_and_linked(client, four_runs):
    r = client.get("/")
    assert '<link rel="stylesheet" href="static/evergreen.css">' in r.text
    assert "<style" not in r.text and " style=" not in r.text  # nothing inline: CSP has no 'unsafe-inline'
    assert r.headers["content-security-policy"] == page.CSP and "style-src 'self'" in page.CSP
    assert "unsafe-inline" not in page.CSP
    css = client.get("/static/evergreen.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert css.text == (PLUGINS / "static" / "evergreen.css").read_text() and ".decision.promoted {" in css.text
    icon = client.get("/icon.svg")  # the nav entry's icon, now a static file too
    assert icon.headers["content-type"].startswith("image/svg+xml") and ET.fromstring(icon.text) is not None


def test_each_run_shows_the_one_text_summary(client, four_runs, root):
    """The page, the summarize log and `make demo` print a run through the same formatter."""
    import html

    from tasks.stages.contracts import RunSummary
    from tasks.stages.report import format_summary

    text = client.get("/").text
    card = re.search(r'<article class="run [^"]*" id="run-0".*?</article>', text, re.S).group(0)
    shown = re.search(r'<details class="text-summary">.*?<pre>(.*?)</pre>', card, re.S).group(1)
    path = root / "continuous_post_training" / "asset_3" / "summary.json"
    assert html.unescape(shown) == format_summary(RunSummary.model_validate_json(path.read_text()))


def test_the_settings_a_runs_params_changed_are_shown(client, root):
    _write(
        root,
        "tuned_1",
        _summary(
            "manual__2026-12-03T09:00:00+00:00",
            "2026-12-03T09:00:00+00:00",
            "promoted",
            overrides={"grpo.steps": 3, "promotion.min_gain": 0.2},
        ),
    )
    card = re.search(r'<article class="run promoted".*?</article>', client.get("/").text, re.S).group(0)
    assert "Settings changed by this run's params:" in card
    assert "<code>grpo.steps=3</code>" in card and "<code>promotion.min_gain=0.2</code>" in card


def test_the_newest_timeline_report_and_its_chart_are_on_the_page(client, root):
    assert 'id="timeline"' not in client.get("/").text and client.get("/timeline.png").status_code == 404
    out = root / "timeline" / "manual__2026-12-07" / "timeline"
    out.mkdir(parents=True)
    policies = [
        {
            "policy": "never",
            "mean_success": 0.41,
            "usd": 0.0,
            "retrains": 0,
            "promotions": 0,
            "false_alarms": 0,
            "hours_to_fix": [None, None],
        },
        {
            "policy": "evergreen",
            "mean_success": 0.8,
            "usd": 0.0123,
            "retrains": 3,
            "promotions": 2,
            "false_alarms": 0,
            "hours_to_fix": [24.0, None],
            "note": XSS,
        },
    ]
    (out / "report.json").write_text(json.dumps({"days": 30, "policies": policies}))
    png = b"\x89PNG\r\n\x1a\n" + b"0" * 64
    (out / "timeline.png").write_bytes(png)
    text = client.get("/").text
    section = re.search(r'<section id="timeline".*?</section>', text, re.S).group(0)
    assert "30 day(s)" in section and "<td>evergreen</td><td>80.0%</td><td>$0.0123</td>" in section
    assert "<td>24 h, not fixed</td>" in section and '<img src="timeline.png"' in section
    got = client.get("/timeline.png")
    assert got.status_code == 200 and got.content == png and got.headers["content-type"] == "image/png"
