"""A local working copy of a storage prefix: how a stage on any worker reads and writes a run kept on S3.

    from tasks.mirror import Mirror
    m = Mirror("s3://bucket/runs/continuous_post_training/run-1", Path("/scratch/worker-a/run-1"))
    m.pull()     # the local copy becomes what the prefix holds (each object's sha256 checked)
    ...          # the stage reads and writes local files, as it does on a local run directory
    m.push()     # what the stage wrote or changed goes up (one PUT per file, its sha256 as metadata)

Engines, trainers and tokenizers want local files; the run's truth is the prefix. A task pulls before it
runs and pushes after (StageOperator, the GRPO job's rank-0 worker after each checkpoint), so no two tasks
need to share a disk: a retried task on another worker starts from what the prefix holds.

`<local>/.mirror.json` keeps, per file, the sha256 and ETag it had when last pulled or pushed: a pull
downloads only objects whose ETag changed, a push uploads only files whose sha256 changed and deletes
the objects of files this task removed. Objects another task wrote meanwhile are never deleted (they are
not in this copy's record). Names starting with "." (atomic writers' temporaries, this record) stay local.
For a local `uri` the two are the same directory and both calls do nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from tasks import storage

log = logging.getLogger(__name__)
RECORD = ".mirror.json"


def remote_objects(uri: str) -> dict[str, str]:
    """{relative key: ETag} of every object under the prefix `uri` (a missing bucket or refused credentials
    raise FileNotFoundError / PermissionError naming the prefix)."""
    bucket, key = storage.split_s3(uri)
    prefix = key.rstrip("/") + "/" if key else ""
    out: dict[str, str] = {}
    with storage.s3_errors(uri):
        for page in storage.s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            out |= {o["Key"][len(prefix) :]: o["ETag"] for o in page.get("Contents", [])}
    return out


def children(uri: str) -> list[str]:
    """The names of the "directories" directly under the prefix `uri` (S3 common prefixes)."""
    bucket, key = storage.split_s3(uri)
    prefix = key.rstrip("/") + "/" if key else ""
    names: list[str] = []
    paginator = storage.s3_client().get_paginator("list_objects_v2")
    with storage.s3_errors(uri):
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
            names += [p["Prefix"][len(prefix) :].rstrip("/") for p in page.get("CommonPrefixes", [])]
    return sorted(names)


def download(uri: str, local: Path) -> tuple[str, str]:
    """One object to `local` (atomic, streamed), its sha256 checked against the one recorded at write;
    returns (sha256, ETag)."""
    response = storage._get_object(uri)
    digest = hashlib.sha256()
    with storage.atomic_writer(local) as f:
        for chunk in iter(lambda: response["Body"].read(1 << 20), b""):
            digest.update(chunk)
            f.write(chunk)
        storage.check_sha256(uri, digest.hexdigest(), response)  # inside the writer: a mismatch replaces nothing
    return digest.hexdigest(), response["ETag"]


def upload(local: Path, uri: str, sha256: str) -> str:
    """One file to `uri` with its sha256 as metadata (multipart above 8 MiB: invisible until whole);
    returns the object's ETag."""
    storage.upload_file(local, uri, sha256=sha256)
    bucket, key = storage.split_s3(uri)
    return str(storage.s3_client().head_object(Bucket=bucket, Key=key)["ETag"])


def _stat(path: Path) -> list[int]:
    """Size and modification time: a file whose stat is as recorded is not read again (a rewrite changes both
    or at least the mtime)."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


class Mirror:
    """A local copy of the prefix `uri` at `local` (see the module docstring)."""

    def __init__(self, uri: str, local: str | Path) -> None:
        self.uri, self.local = str(uri).rstrip("/"), Path(local).resolve()
        self.remote = storage.is_s3(self.uri)

    def _record(self) -> dict[str, dict[str, Any]]:
        path = self.local / RECORD
        return json.loads(path.read_text()) if path.exists() else {}

    def _save(self, record: dict[str, Any]) -> None:
        storage.write_atomic(self.local / RECORD, json.dumps(record, sort_keys=True))

    def _local_files(self) -> dict[str, Path]:
        if not self.local.is_dir():
            return {}
        return {
            str(p.relative_to(self.local)): p
            for p in self.local.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(self.local).parts)
        }

    def pull(self, prefixes: tuple[str, ...] = (), suffixes: tuple[str, ...] = ()) -> dict[str, int]:
        """Make the local copy what the prefix holds (only keys under `prefixes` / ending in `suffixes`, when
        given): download what changed, delete the synced local files the prefix no longer has. Returns counts
        (downloaded, kept, deleted)."""
        if not self.remote:
            return {}
        started = time.monotonic()
        self.local.mkdir(parents=True, exist_ok=True)

        def wanted(key: str) -> bool:
            return (not prefixes or key.startswith(prefixes)) and (not suffixes or key.endswith(suffixes))

        objects = {k: e for k, e in remote_objects(self.uri).items() if wanted(k)}
        record, files = self._record(), self._local_files()
        got = kept = 0
        for key, etag in sorted(objects.items()):
            if any(part.startswith(".") for part in key.split("/")):
                continue
            target = storage.inside_dir(self.local, key, what=f"object {self.uri}/{key}")
            if key in files:
                known, stat = record.get(key), _stat(target)
                if known and known["etag"] == etag and known.get("stat") == stat:
                    kept += 1  # neither side changed since this copy's last sync: not even hashed again
                    continue
                sha = storage.sha256_file(target)
                # unchanged bytes, or the same bytes another copy left here (one HEAD)
                if (known and known["etag"] == etag and known["sha256"] == sha) or self._object_sha(key) == sha:
                    record[key] = {"sha256": sha, "etag": etag, "stat": stat}
                    kept += 1
                    continue
            sha, etag = download(f"{self.uri}/{key}", target)
            record[key] = {"sha256": sha, "etag": etag, "stat": _stat(target)}
            got += 1
        # a file the prefix no longer has, that this copy had synced: removed by another task. A file never
        # synced is a task's output on its way up (mapped tasks share a worker's copy): left alone
        gone = [k for k in files if k not in objects and k in record and wanted(k)]
        for key in gone:
            files[key].unlink()
            record.pop(key, None)
        self._save(record)
        counts = {"downloaded": got, "kept": kept, "deleted": len(gone)}
        log.info("pulled %s into %s in %.1f s: %s", self.uri, self.local, time.monotonic() - started, counts)
        return counts

    def _object_sha(self, key: str) -> str | None:
        bucket, name = storage.split_s3(f"{self.uri}/{key}")
        return storage.s3_client().head_object(Bucket=bucket, Key=name).get("Metadata", {}).get(storage.SHA256_META)

    def push(self) -> dict[str, int]:
        """Upload the files whose sha256 changed since the last pull or push; delete the objects of files
        this copy had and no longer has. Returns counts (uploaded, deleted)."""
        if not self.remote:
            return {}
        started = time.monotonic()
        record, files = self._record(), self._local_files()
        sent = 0
        for key, path in sorted(files.items()):
            known, stat = record.get(key, {}), _stat(path)
            if known.get("stat") == stat:
                continue  # not touched since its last sync
            sha = storage.sha256_file(path)
            if known.get("sha256") != sha:
                known = {"sha256": sha, "etag": upload(path, f"{self.uri}/{key}", sha)}
                sent += 1
            record[key] = {**known, "stat": stat}
        gone = [k for k in record if k not in files]
        for key in gone:
            bucket, name = storage.split_s3(f"{self.uri}/{key}")
            storage.s3_client().delete_object(Bucket=bucket, Key=name)
            del record[key]
        if self.local.is_dir():
            self._save(record)
        counts = {"uploaded": sent, "deleted": len(gone)}
        log.info("pushed %s to %s in %.1f s: %s", self.local, self.uri, time.monotonic() - started, counts)
        return counts
