"""tasks.storage against a real S3 endpoint behind a TCP proxy that cuts connections mid-upload:
retries with backoff, then a clean failure with no partial object; sha256 checked on read."""

from __future__ import annotations

import contextlib
import os
import socket
import threading

import pytest

pytestmark = pytest.mark.integration


class CuttingProxy:
    """Forwards 127.0.0.1:port to the S3 endpoint; the first `cuts` connections are closed after
    `cut_after` request bytes (what a dying endpoint or a dropped link looks like to the client)."""

    def __init__(self, target_port: int, cuts: int, cut_after: int = 256 * 1024):
        self.target_port, self.cuts, self.cut_after = target_port, cuts, cut_after
        self.connections = 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            cut = self.connections <= self.cuts
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(
                target=self._pipe, args=(client, upstream, self.cut_after if cut else None), daemon=True
            ).start()
            threading.Thread(target=self._pipe, args=(upstream, client, None), daemon=True).start()

    @staticmethod
    def _pipe(src, dst, limit):
        sent = 0
        try:
            while data := src.recv(65536):
                if limit is not None and sent + len(data) > limit:
                    break
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self):
        self.server.close()


@pytest.fixture
def through_proxy(s3_through):
    return lambda cuts: s3_through(lambda port: CuttingProxy(port, cuts))


def _exists(s3, bucket, key) -> bool:
    return any(o["Key"] == key for o in s3.list_objects_v2(Bucket=bucket).get("Contents", []))


def test_endpoint_dying_mid_upload_retries_then_fails_with_no_partial_object(s3, through_proxy, tmp_path):
    from tasks import storage

    s3.create_bucket(Bucket="faults")
    big = tmp_path / "weights.bin"
    big.write_bytes(os.urandom(20 << 20))  # 3 multipart parts of 8 MiB
    proxy = through_proxy(cuts=10_000)  # every connection dies after 256 KiB
    with pytest.raises(Exception) as info:
        storage.upload_file(big, "s3://faults/models/v9/weights.bin")
    assert "evergreen-test-secret" not in str(info.value)
    assert proxy.connections > 3, f"botocore retried ({proxy.connections} connections)"
    assert not _exists(s3, "faults", "models/v9/weights.bin"), "no partial object is visible"
    with pytest.raises(Exception):
        storage.write_bytes("s3://faults/report.json", os.urandom(1 << 20))
    assert not _exists(s3, "faults", "report.json")


def test_transient_cuts_are_retried_and_the_object_arrives_whole(s3, through_proxy, tmp_path):
    from tasks import storage

    s3.create_bucket(Bucket="transient")
    data = os.urandom(3 << 20)
    through_proxy(cuts=2)  # the first two connections die, the rest pass
    storage.write_bytes("s3://transient/a.bin", data)
    assert storage.read_bytes("s3://transient/a.bin") == data


def test_an_object_changed_behind_our_back_is_refused_on_read(s3):
    from tasks import storage
    from tasks.storage import ChecksumError

    s3.create_bucket(Bucket="checked")
    storage.write_bytes("s3://checked/report.json", b'{"drifted": true}')
    head = s3.head_object(Bucket="checked", Key="report.json")
    s3.put_object(Bucket="checked", Key="report.json", Body=b'{"drifted": false}', Metadata=head["Metadata"])
    with pytest.raises(ChecksumError, match="s3://checked/report.json"):
        storage.read_bytes("s3://checked/report.json")


def test_a_model_object_key_with_dotdot_cannot_write_outside_the_download_dir(s3, tmp_path):
    from tasks import storage
    from tasks.policy.model import resolve_model_dir

    s3.create_bucket(Bucket="models")
    storage.write_bytes("s3://models/m/config.json", b"{}")
    # S3 keys are strings: "m/../../escape.txt" is a valid key under the prefix "m/"
    s3.put_object(Bucket="models", Key="m/../../escape.txt", Body=b"owned")
    dest = tmp_path / "deep" / "dl"
    with pytest.raises(ValueError, match="outside"):
        resolve_model_dir("s3://models/m", cache_dir=dest)
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "deep" / "escape.txt").exists()
