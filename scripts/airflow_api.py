"""The Airflow 3 REST API as the stack's tests and scripts use it (JWT login, trigger, wait, logs).

Usage:

    from scripts.airflow_api import ApiClient
    client = ApiClient("http://127.0.0.1:8080", "evergreen", password)   # or Stack.client()
    run = client.wait_for_run("bootstrap_champion", client.trigger("bootstrap_champion"))
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request


class ApiClient:
    """Airflow REST API v2 with a token from POST /auth/token (the simple auth manager)."""

    def __init__(self, base_url: str, username: str, password: str):
        self.base_url, self.username, self.password = base_url.rstrip("/"), username, password
        self._token: str | None = None

    def token(self) -> str:
        if self._token is None:
            body = self._raw("POST", "/auth/token", {"username": self.username, "password": self.password}, auth=False)
            self._token = body["access_token"]
        return self._token

    def _raw(self, method: str, path: str, payload=None, auth: bool = True, text: bool = False):
        data = json.dumps(payload).encode() if payload is not None else None
        req = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        if auth:
            req.add_header("Authorization", f"Bearer {self.token()}")
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                raw = resp.read().decode()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:1000]
            raise RuntimeError(f"{method} {path}: HTTP {e.code}: {detail}") from None
        if text:
            return raw
        return json.loads(raw) if raw else {}

    def get(self, path: str):
        return self._raw("GET", path)

    def post(self, path: str, payload: dict):
        return self._raw("POST", path, payload)

    def patch(self, path: str, payload: dict):
        return self._raw("PATCH", path, payload)

    # the calls the demo and the tests make ---------------------------------------------------------
    def wait_for_dags(self, dag_ids: list[str], timeout: float = 180) -> None:
        deadline = time.time() + timeout
        while True:
            found = {d["dag_id"] for d in self.get("/api/v2/dags?limit=100")["dags"]}
            if set(dag_ids) <= found:
                return
            if time.time() > deadline:
                errors = self.get("/api/v2/importErrors").get("import_errors", [])
                raise TimeoutError(
                    f"DAGs {sorted(set(dag_ids) - found)} not parsed after {timeout}s; "
                    f"import errors: {json.dumps(errors)[:2000]}"
                )
            time.sleep(2)

    def unpause(self, dag_id: str) -> None:
        self.patch(f"/api/v2/dags/{dag_id}", {"is_paused": False})

    def trigger(self, dag_id: str, conf: dict | None = None) -> str:
        run = self.post(f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf or {}})
        return run["dag_run_id"]

    def asset_id(self, name: str) -> int:
        for asset in self.get(f"/api/v2/assets?name_pattern={name}&limit=100")["assets"]:
            if asset["name"] == name:
                return asset["id"]
        raise LookupError(f"asset {name!r} is not registered: is the DAG that declares it parsed?")

    def post_asset_event(self, name: str, extra: dict) -> dict:
        return self.post("/api/v2/assets/events", {"asset_id": self.asset_id(name), "extra": extra})

    def runs(self, dag_id: str) -> list[dict]:
        return self.get(f"/api/v2/dags/{dag_id}/dagRuns?order_by=-start_date&limit=50")["dag_runs"]

    def wait_for_run(
        self, dag_id: str, run_id: str | None = None, timeout: float = 1800, after: str | None = None, progress=print
    ) -> dict:
        """Wait until the run (or the first run of the DAG that starts after `after`, an ISO time) ends."""
        deadline, last = time.time() + timeout, None
        while time.time() < deadline:
            run = None
            if run_id:
                run = self.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
            else:
                runs = [r for r in self.runs(dag_id) if not after or (r.get("queued_at") or "") >= after]
                run = runs[-1] if runs else None
            if run:
                tis = self.get(f"/api/v2/dags/{dag_id}/dagRuns/{run['dag_run_id']}/taskInstances?limit=100")
                running = sorted(
                    t["task_id"] + (f"[{t['map_index']}]" if t.get("map_index", -1) >= 0 else "")
                    for t in tis["task_instances"]
                    if t["state"] in ("running", "deferred", "queued")
                )
                line = f"{dag_id}: {run['state']}" + (f" ({', '.join(running)})" if running else "")
                if line != last:
                    progress(f"  [{time.strftime('%H:%M:%S')}] {line}")
                    last = line
                if run["state"] in ("success", "failed"):
                    return run
            time.sleep(1.5)
        raise TimeoutError(f"{dag_id} run {run_id or '(next)'} did not finish in {timeout}s")

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1, map_index: int = -1) -> str:
        path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}?full_content=true"
        if map_index >= 0:
            path += f"&map_index={map_index}"
        body = self._raw("GET", path)
        content = body.get("content", body)
        if isinstance(content, list):
            return "\n".join(c.get("event", json.dumps(c)) if isinstance(c, dict) else str(c) for c in content)
        return str(content)
