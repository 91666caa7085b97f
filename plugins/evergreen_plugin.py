"""The Evergreen Airflow plugin: the Evergreen page (plugins/evergreen_page.py) inside the Airflow 3 UI.

Airflow loads every .py file of its plugins folder; point it here and start the api-server:

    AIRFLOW__CORE__PLUGINS_FOLDER=$PWD/plugins airflow api-server
    # sidebar button "Evergreen" -> /plugin/evergreen (an iframe of /evergreen/)
    airflow plugins        # lists evergreen with its fastapi_apps and external_views

How Airflow 3.3 uses the two entries (read from airflow/api_fastapi/app.py and the UI bundle):
- fastapi_apps: the api-server mounts the app at url_prefix (/evergreen) before its catch-all UI route.
  Airflow does not authenticate a mounted app; evergreen_page.airflow_auth checks the UI's `_token` cookie
  (or a Bearer token) itself, so only users who may read the DAG's runs see them.
- external_views with url_route: the UI adds a nav entry to /plugin/<url_route> and renders href there in
  an <iframe sandbox="allow-scripts allow-same-origin allow-forms allow-downloads">, same origin, so the
  cookie is sent. nav_top_level puts "Evergreen" in the sidebar itself, not under a "Plugins" menu; a
  category outside user/docs/admin/browse only groups views inside that "Plugins" menu.

The page is evergreen_page.py (the app), evergreen_data.py (reads the runs' summaries), evergreen_charts.py
(chart geometry), templates/ (Jinja2) and static/ (CSS, icon). Airflow also imports the two helper modules
as plugin files; they define no plugin and do nothing at import.

Import cost: fastapi and those modules only (no torch, ray, mlflow or great_expectations, nor the project's
tasks package); the app object is built without touching the disk, and Jinja2 loads the templates on the
first page view.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

try:
    # Airflow puts the plugins folder on sys.path before it loads plugins.
    from evergreen_page import create_airflow_app
except ModuleNotFoundError as exc:  # imported as plugins.evergreen_plugin (project root on the path)
    if exc.name != "evergreen_page":
        raise
    from plugins.evergreen_page import create_airflow_app


class EvergreenPlugin(AirflowPlugin):
    name = "evergreen"
    fastapi_apps = [{"app": create_airflow_app(), "url_prefix": "/evergreen", "name": "Evergreen"}]
    external_views = [
        {
            "name": "Evergreen",
            "href": "/evergreen/",
            "destination": "nav",
            "url_route": "evergreen",
            "nav_top_level": True,
            "icon": "/evergreen/icon.svg",
            "category": "Evergreen",
        }
    ]
