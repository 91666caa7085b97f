"""A fake Kubernetes API server (RayCluster, pods, Secrets) and a fake Ray Jobs API, on 127.0.0.1.

No Kubernetes API server can run on this machine (no Docker, no kind, no cluster), so the KubeRay hook's calls
go to a small HTTP server (http.server in a thread) that implements just the endpoints the kubernetes client
calls here: RayCluster create / get / delete (ray.io/v1, namespaced), pods by label selector and one Secret.
The real kubernetes client talks HTTP to it through a kubernetes.client.Configuration (or a kubeconfig) whose
host is the fake, so request paths, bodies, status codes and the client's (de)serialisation are real; what the
fake cannot show is KubeRay itself (the operator that turns the resource into pods): its state moves to
"ready" after a set number of GETs, and a deleted cluster disappears after a set number more.

FakeJobs is the same for the Ray Jobs API that `ray.job_submission.JobSubmissionClient` calls (version check,
submit, status, logs, stop), recording each request's Authorization header; a job SUCCEEDS on its first status
read.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

NS = "evergreen"
_CLUSTER = re.compile(r"^/apis/ray\.io/v1/namespaces/([^/]+)/rayclusters(?:/([^/]+))?$")
_PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods$")
_SECRET = re.compile(r"^/api/v1/namespaces/([^/]+)/secrets/([^/]+)$")


# --------------------------------------------------------------------------------------------------
# the fake API server
# --------------------------------------------------------------------------------------------------
class FakeKube:
    """State of the fake API server; tests set the knobs, the handler reads and writes the rest."""

    def __init__(self):
        self.clusters: dict[tuple[str, str], dict] = {}
        self.created = 0
        self.gets: dict[tuple[str, str], int] = {}
        self.requests: list[tuple[str, str, dict | None]] = []
        self.gets_until_ready = 2  # GETs before status.state becomes "ready"
        self.gets_until_gone = 1  # GETs after a DELETE before the object is gone
        self.final_state = "ready"
        self.forbid = False  # answer 403 to everything (missing RBAC)
        self.pods: list[dict] = []
        self.secrets: dict[tuple[str, str], dict] = {}


def _status(code: int, reason: str, message: str) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class _JsonHandler(BaseHTTPRequestHandler):
    """What both fakes share: JSON bodies in and out, no request log in pytest's output."""

    def log_message(self, *args):
        pass

    def _body(self) -> dict | None:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length)) if length else None

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def kube_handler(fake: FakeKube) -> type[BaseHTTPRequestHandler]:
    class Handler(_JsonHandler):
        def _route(self, method: str) -> None:
            url = urlparse(self.path)
            body = self._body()
            fake.requests.append((method, self.path, body))
            if fake.forbid:
                return self._send(
                    403,
                    _status(
                        403,
                        "Forbidden",
                        "rayclusters.ray.io is forbidden: User "
                        '"system:serviceaccount:airflow:default" cannot create resource',
                    ),
                )
            if m := _CLUSTER.match(url.path):
                return self._cluster(method, m.group(1), m.group(2), body)
            if (m := _PODS.match(url.path)) and method == "GET":
                selector = parse_qs(url.query).get("labelSelector", [""])[0]
                key, _, value = selector.partition("=")
                items = [p for p in fake.pods if p["metadata"].get("labels", {}).get(key) == value]
                return self._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})
            if (m := _SECRET.match(url.path)) and method == "GET":
                secret = fake.secrets.get((m.group(1), m.group(2)))
                if secret is None:
                    return self._send(404, _status(404, "NotFound", f'secrets "{m.group(2)}" not found'))
                return self._send(200, secret)
            return self._send(404, _status(404, "NotFound", f"no route {method} {url.path} in the fake"))

        def _cluster(self, method: str, ns: str, name: str | None, body: dict | None) -> None:
            if method == "POST" and name is None:
                key = (ns, body["metadata"]["name"])
                if key in fake.clusters:
                    return self._send(
                        409, _status(409, "AlreadyExists", f'rayclusters.ray.io "{key[1]}" already exists')
                    )
                obj = json.loads(json.dumps(body))
                fake.created += 1
                obj["metadata"].update(
                    uid=f"uid-{fake.created}", resourceVersion="1", creationTimestamp="2026-12-02T00:00:00Z"
                )
                fake.clusters[key], fake.gets[key] = obj, 0
                return self._send(201, obj)
            key = (ns, name)
            obj = fake.clusters.get(key)
            if obj is None:
                return self._send(404, _status(404, "NotFound", f'rayclusters.ray.io "{name}" not found'))
            if method == "GET":
                fake.gets[key] += 1
                if obj["metadata"].get("deletionTimestamp"):
                    obj["_gone_in"] -= 1
                    if obj["_gone_in"] < 0:
                        del fake.clusters[key]
                        return self._send(404, _status(404, "NotFound", f'rayclusters.ray.io "{name}" not found'))
                elif fake.gets[key] >= fake.gets_until_ready:
                    obj["status"] = {
                        "state": fake.final_state,
                        "reason": "" if fake.final_state == "ready" else "boom",
                        "readyWorkerReplicas": 1,
                        "desiredWorkerReplicas": 1,
                        "head": {"serviceName": f"{name}-head-svc", "podIP": "10.0.0.5"},
                    }
                else:
                    obj["status"] = {"desiredWorkerReplicas": 1, "readyWorkerReplicas": 0}
                return self._send(200, {k: v for k, v in obj.items() if not k.startswith("_")})
            if method == "DELETE":
                obj["metadata"]["deletionTimestamp"] = "2026-12-02T01:00:00Z"
                obj["_gone_in"] = fake.gets_until_gone - 1
                return self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
            return self._send(405, _status(405, "MethodNotAllowed", method))

        def do_GET(self):
            self._route("GET")

        def do_POST(self):
            self._route("POST")

        def do_DELETE(self):
            self._route("DELETE")

    return Handler


@contextmanager
def serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[ThreadingHTTPServer]:
    """`handler` on a free port of 127.0.0.1 in a thread, for the duration of the block."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()


class FakeJobs:
    """The Ray Jobs API's state: submitted jobs and every request as (method, path, Authorization header)."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict] = {}
        self.requests: list[tuple[str, str, str | None]] = []


def jobs_handler(fake: FakeJobs) -> type[BaseHTTPRequestHandler]:
    class Handler(_JsonHandler):
        def _route(self, method: str) -> None:
            path = urlparse(self.path).path
            fake.requests.append((method, path, self.headers.get("Authorization")))
            body = self._body()
            if path == "/api/version" and method == "GET":
                return self._send(200, {"version": "4", "ray_version": "2.60.0", "ray_commit": "fake"})
            if path == "/api/jobs/" and method == "POST":
                sid = body["submission_id"]
                fake.jobs[sid] = {
                    "type": "SUBMISSION",
                    "submission_id": sid,
                    "job_id": None,
                    "status": "PENDING",
                    "entrypoint": body["entrypoint"],
                    "metadata": body.get("metadata") or {},
                }
                return self._send(200, {"job_id": sid, "submission_id": sid})
            m = re.match(r"^/api/jobs/([^/]+)(/logs|/stop)?$", path)
            job = fake.jobs.get(m.group(1)) if m else None
            if job is None:
                return self._send(404, {"error": f"no route or job for {method} {path}"})
            if m.group(2) is None and method == "GET":
                answer = dict(job)
                job["status"] = "SUCCEEDED"  # the next read sees it finished
                return self._send(200, answer)
            if m.group(2) == "/logs" and method == "GET":
                return self._send(200, {"logs": "hello from the job\n"})
            if m.group(2) == "/stop" and method == "POST":
                return self._send(200, {"stopped": job["status"] in ("PENDING", "RUNNING")})
            return self._send(405, {"error": method})

        def do_GET(self):
            self._route("GET")

        def do_POST(self):
            self._route("POST")

    return Handler
