"""Fault matrix: the S3 endpoint answers 503 SlowDown and 500s (an HTTP proxy in front of the moto server,
on 127.0.0.1). Throttling for a while is retried within botocore's bound (5 retries) and the object
arrives whole; errors past the bound fail the write with the status, in bounded time, and no object,
partial or whole, is visible."""

from __future__ import annotations

import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytestmark = [pytest.mark.faults, pytest.mark.integration]


class ErrorProxy:
    """Forwards to the S3 endpoint, but answers the first `failures` requests with `status` (an S3 error
    document) instead."""

    def __init__(self, upstream_port: int, failures: int, status: int = 503, code: str = "SlowDown"):
        self.failures, self.answered, self.requests = failures, 0, []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as S3 does: the client's pooled connection stays good

            def log_message(self, *args):
                pass

            def _any(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                proxy.answered += 1
                proxy.requests.append(f"{self.command} {self.path}")
                if proxy.answered <= proxy.failures:
                    doc = f"<Error><Code>{code}</Code><Message>injected</Message></Error>".encode()
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(doc)))
                    self.end_headers()
                    self.wfile.write(doc)
                    return
                conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=30)
                conn.request(self.command, self.path, body=body, headers=dict(self.headers))
                reply = conn.getresponse()
                data = reply.read()
                self.send_response(reply.status)
                for k, v in reply.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


@pytest.fixture
def proxied(s3_through):
    return lambda failures, status=503, code="SlowDown": s3_through(
        lambda port: ErrorProxy(port, failures, status, code)
    )


def _keys(s3, bucket) -> list[str]:
    return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]


def test_throttling_for_a_while_is_retried_and_the_object_arrives_whole(s3, proxied):
    from tasks import storage

    s3.create_bucket(Bucket="throttled")
    proxy = proxied(failures=3)  # three 503 SlowDown, then the endpoint again
    storage.write_bytes("s3://throttled/run/summary.json", b'{"status": "promoted"}')
    assert proxy.answered >= 4
    assert storage.read_bytes("s3://throttled/run/summary.json") == b'{"status": "promoted"}'


def test_errors_past_the_retry_bound_fail_cleanly_and_leave_no_object(s3, proxied):
    from botocore.exceptions import ClientError

    from tasks import storage

    s3.create_bucket(Bucket="failing")
    proxy = proxied(failures=10_000, status=500, code="InternalError")
    t0 = time.monotonic()
    with pytest.raises(ClientError, match="InternalError"):  # not relabelled "not found": raised as it is
        storage.write_bytes("s3://failing/run/summary.json", b"{}")
    puts = [r for r in proxy.requests if r.startswith("PUT")]
    # the first attempt and storage's 5 retries (botocore's max_attempts counts retries): bounded in count and time
    assert time.monotonic() - t0 < 60 and len(puts) == 6, proxy.requests
    with pytest.raises(ClientError, match="InternalError"):
        storage.list_files("s3://failing/run/")
    assert _keys(s3, "failing") == []  # the real endpoint, directly: nothing was written
