"""The Evergreen page: one FastAPI app that shows why each continuous_post_training run ran, what it
measured, what it cost and what the promotion gate decided.

Airflow mounts it at /evergreen (plugins/evergreen_plugin.py) and shows it in the UI's nav bar, inside an
iframe at /plugin/evergreen. To look at it without Airflow:

    EVERGREEN_RUN_DIR=runs/local uvicorn --factory plugins.evergreen_page:create_app --port 8090
    # then open http://127.0.0.1:8090/  (routes: /, /api/runs, /timeline.png, /health, /icon.svg, /static/...)

- data: plugins/evergreen_data.py reads every run's summary.json as a RunSummary, per request;
  plugins/evergreen_charts.py lays out the two charts.
- markup: Jinja2 templates in plugins/templates (page.html, denied.html, macros/run.html for a run's
  card, macros/charts.html for the SVG charts), autoescaped: every string from a summary is
  user-controlled (reasons, asset event extras, REST params) and reaches the HTML escaped. Links must
  be http(s) or a path on this server. None prints as "—" everywhere (the environment's finalize).
- style: plugins/static/evergreen.css, served by this app at static/; the page sends a
  Content-Security-Policy that allows that stylesheet and no script at all.

Tests: tests/unit/plugins/test_evergreen_page.py (TestClient), tests/e2e/test_browser.py (Airflow UI).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

if __package__:  # plugins.evergreen_page: the project root on sys.path (tests, uvicorn)
    from . import evergreen_charts as charts
    from . import evergreen_data as data
else:  # evergreen_page: Airflow's plugins folder on sys.path
    import evergreen_charts as charts
    import evergreen_data as data

DAG_ID, STATUS_LABEL = data.DAG_ID, data.STATUS_LABEL
HERE = Path(__file__).resolve().parent
TEMPLATES, STATIC = HERE / "templates", HERE / "static"
MAX_RUNS_SHOWN = 100
DASH = "—"
# No script anywhere on the page: even a summary string that escaped the escaping could not run.
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self' data:; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'self'"
)
PAGE_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}

Auth = Callable[[Request], Awaitable[None]]


# ------------------------------------------------------------------------------ filters (text only)


def pct(v: Any, unit: str = "%") -> str:
    n = data.num(v)
    return DASH if n is None else f"{100 * n:.1f}{unit}"


def pts(v: Any) -> str:
    n = data.num(v)
    return DASH if n is None else f"{100 * n:+.1f}"


def usd(v: Any) -> str:
    n = data.num(v)
    if n is None:
        return DASH
    return f"${n:,.2f}" if abs(n) >= 1 else f"${n:.4f}"


def fmt(v: Any, spec: str) -> str:
    n = data.num(v)
    return DASH if n is None else format(n, spec)


def plain(v: Any) -> Any:
    """A check's observed value or threshold: numbers rounded, structures as JSON, the rest as is."""
    n = data.num(v)
    if n is not None:
        return f"{n:.4g}"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):  # NaN or infinity: no measurement
        return DASH
    if isinstance(v, (dict, list)):
        return json.dumps(v, default=str)
    return v


def when(v: Any) -> Any:
    ts = data.parse_ts(v)
    return v if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(v: Any) -> str:
    s = data.num(v)
    if s is None:
        return DASH
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


def yes_no(v: Any) -> str:
    return DASH if v is None else ("yes" if v else "no")


def pretty(v: Any) -> str:
    return json.dumps(v, indent=1, ensure_ascii=False, default=str)


def linkable(url: Any) -> bool:
    """An anchor only for http(s) URLs and paths on this server (the Airflow run link is "/dags/...");
    a summary could carry `javascript:`, and "//host" is another site."""
    return isinstance(url, str) and (
        url.lower().startswith(("http://", "https://")) or (url.startswith("/") and not url.startswith("//"))
    )


def status_class(status: str) -> str:
    return status if status in STATUS_LABEL else "other"


def status_label(status: str) -> str:
    return STATUS_LABEL.get(status, status)


def gpd(summary: Any) -> str:
    g = data.gain_per_dollar(summary)
    return DASH if g is None else f"{g:.1f} pts/$"


FILTERS = {
    f.__name__: f
    for f in (pct, pts, usd, fmt, plain, when, duration, yes_no, pretty, linkable, status_class, status_label, gpd)
}
FILTERS.update(num=data.num, dig=data.dig, as_list=data.as_list, dicts=data.dicts, text_summary=data.text_summary)


@functools.cache
def environment():
    """The templates' Jinja2 environment, built on first use (importing this module reads no file)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html", "svg"), default=True),
        undefined=jinja2.StrictUndefined,  # a misspelt name fails the test, not a blank on the page
        finalize=lambda v: DASH if v is None else v,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(FILTERS)
    env.globals.update(registries=data.registries, DAG_ID=DAG_ID, DASH=DASH)
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)


def render_page(runs: data.Runs) -> str:
    shown = runs.runs[:MAX_RUNS_SHOWN]
    return render(
        "page.html",
        data=runs,
        runs=shown,
        hidden=len(runs.runs) - len(shown),
        success_chart=charts.success_chart(shown),
        cost_chart=charts.cost_chart(shown),
        timeline=data.latest_timeline(runs.root),
    )


# ------------------------------------------------------------------------------------------------ app


def create_app(*, auth: Auth | None = None, login_url: Callable[[Request], str] | None = None) -> FastAPI:
    """The Evergreen app. `auth(request)` raises HTTPException(401/403) for a caller who may not see the
    runs (None: everyone may, as in tests and the standalone uvicorn mode); `login_url(request)` is where
    an unauthenticated browser is sent instead of a bare 401. Building it does no I/O."""
    app = FastAPI(title="Evergreen", docs_url=None, redoc_url=None, openapi_url=None)
    # The stylesheet: static and free of run data, so served without the auth check, like the icon.
    app.mount("/static", StaticFiles(directory=STATIC, check_dir=False), name="static")

    async def check(request: Request, html_page: bool) -> Response | None:
        if auth is None:
            return None
        try:
            await auth(request)
        except HTTPException as exc:
            if not html_page:
                return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)
            if exc.status_code == 401 and login_url is not None:
                return RedirectResponse(login_url(request), status_code=303)
            # 403: a bad or foreign token, or a user without access to the DAG's runs: say so, in the page
            body = render("denied.html", detail=exc.detail, login_url=login_url(request) if login_url else None)
            return HTMLResponse(body, status_code=exc.status_code, headers=PAGE_HEADERS)
        return None

    @app.get("/", response_class=HTMLResponse)
    async def page(request: Request) -> Response:
        denied = await check(request, html_page=True)
        if denied is not None:
            return denied
        return HTMLResponse(render_page(data.load_runs()), headers=PAGE_HEADERS)

    @app.get("/api/runs")
    async def api_runs(request: Request) -> Response:
        denied = await check(request, html_page=False)
        if denied is not None:
            return denied
        runs = data.load_runs()
        return JSONResponse(
            {
                "dag_id": DAG_ID,
                "runs_root": None if runs.root is None else str(runs.root),
                "count": len(runs.runs),
                "runs": [r.as_json() for r in runs.runs],
                "errors": runs.errors,
            },
            headers={"Cache-Control": "no-store"},
        )

    @app.get("/timeline.png")
    async def timeline_chart(request: Request) -> Response:
        # run data (the policies' daily success and dollars): behind the same check as the page
        denied = await check(request, html_page=False)
        if denied is not None:
            return denied
        found = data.latest_timeline(data.runs_root())
        if found is None or found["chart"] is None:
            raise HTTPException(404, "no timeline chart: run `python -m tasks timeline` or the timeline DAG")
        return FileResponse(found["chart"], media_type="image/png", headers={"Cache-Control": "no-store"})

    @app.get("/icon.svg")
    async def icon() -> Response:
        # The nav entry's icon (external_views "icon"); static, so no auth (the UI loads it with <img>).
        return FileResponse(STATIC / "icon.svg", media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})

    @app.get("/health")
    async def health() -> dict:
        # Unauthenticated on purpose (probes): counts only, no run content.
        runs = data.load_runs()
        return {
            "status": "ok" if runs.root is not None else "error",
            "runs": len(runs.runs),
            "errors": len(runs.errors),
        }

    return app


# ----------------------------------------------------------------------------- inside the Airflow server


async def airflow_auth(request: Request) -> None:
    """The Airflow UI's own check: the `_token` cookie (or a Bearer token) must belong to a user who may
    read continuous_post_training's runs. Airflow imports happen here, per request, so the plugin module
    stays light; they are already loaded in the api-server that calls this."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
    from airflow.api_fastapi.core_api.security import bearer_scheme, get_user

    user = await get_user(request, None, await bearer_scheme(request))
    if not get_auth_manager().is_authorized_dag(
        method="GET", access_entity=DagAccessEntity.RUN, details=DagDetails(id=DAG_ID), user=user
    ):
        raise HTTPException(status_code=403, detail=f"not allowed to read the runs of {DAG_ID}")


def airflow_login_url(request: Request) -> str:
    from airflow.api_fastapi.app import get_auth_manager

    return get_auth_manager().get_url_login(next_url=str(request.url))


def create_airflow_app() -> FastAPI:
    return create_app(auth=airflow_auth, login_url=airflow_login_url)
