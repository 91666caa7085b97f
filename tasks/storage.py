"""One interface over a local directory and S3 (boto3, any S3-compatible endpoint).

    from tasks import storage
    storage.list_files("s3://bucket/traces/")          # sorted URIs of the objects under a prefix
    with storage.open_binary("s3://bucket/traces/2026-12-01/part-0.jsonl.gz") as f: ...   # streamed
    storage.write_bytes("runs/x/report.json", data)     # atomic: temporary name, then rename
    storage.read_bytes("http://tools.internal/openapi.json")   # http(s) is read-only

The S3 endpoint comes from `EVERGREEN_S3_ENDPOINT_URL`, else boto3's own `AWS_ENDPOINT_URL_S3` /
`AWS_ENDPOINT_URL`, else AWS. Credentials come from boto3's usual chain and are never logged: error
messages name the bucket and key only. Transient S3 errors are retried by botocore (standard mode).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator


def is_s3(uri: str | Path) -> bool:
    return str(uri).startswith("s3://")


def is_http(uri: str | Path) -> bool:
    """http(s):// sources are read-only here (e.g. a tool service's OpenAPI document)."""
    return str(uri).startswith(("http://", "https://"))


def split_s3(uri: str) -> tuple[str, str]:
    bucket, _, key = uri[len("s3://"):].partition("/")
    if not bucket:
        raise ValueError(f"{uri!r} is not an s3:// URI of the form s3://bucket/key")
    return bucket, key


@functools.lru_cache(maxsize=4)
def _client(endpoint_url: str | None):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint_url,
                        config=Config(retries={"mode": "standard", "max_attempts": 5}))


def s3_client():
    return _client(os.environ.get("EVERGREEN_S3_ENDPOINT_URL") or None)


def list_files(uri: str | Path, suffixes: tuple[str, ...] = ()) -> list[str]:
    """Sorted URIs of the files under a directory / prefix (or the file itself), filtered by suffix."""
    uri = str(uri)
    if is_s3(uri):
        bucket, key = split_s3(uri)
        s3 = s3_client()
        out = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
            out += [f"s3://{bucket}/{o['Key']}" for o in page.get("Contents", [])]
    else:
        path = Path(uri)
        if path.is_file():
            return [str(path)]
        if not path.is_dir():
            raise FileNotFoundError(f"{path} is neither a file nor a directory: check the input path")
        out = [str(p) for p in path.rglob("*") if p.is_file()]
    return sorted(u for u in out if not suffixes or u.endswith(suffixes))


def open_binary(uri: str | Path) -> BinaryIO:
    """A readable binary stream; S3 objects are streamed, never read whole into memory."""
    uri = str(uri)
    if is_s3(uri):
        bucket, key = split_s3(uri)
        try:
            return s3_client().get_object(Bucket=bucket, Key=key)["Body"]
        except Exception as e:  # botocore's ClientError carries no credentials; re-raise with the object name
            raise FileNotFoundError(f"cannot read s3://{bucket}/{key}: {e}") from None
    if is_http(uri):
        import urllib.request

        try:
            return urllib.request.urlopen(uri, timeout=30)
        except OSError as e:
            raise FileNotFoundError(f"cannot read {uri}: {e}") from None
    return open(uri, "rb")


def read_bytes(uri: str | Path) -> bytes:
    with open_binary(uri) as f:
        return f.read()


def write_bytes(uri: str | Path, data: bytes) -> str:
    """Write atomically: a reader sees the old object or the whole new one, never a part."""
    uri = str(uri)
    if is_s3(uri):
        bucket, key = split_s3(uri)
        s3_client().put_object(Bucket=bucket, Key=key, Body=data)  # a single PUT is atomic in S3
        return uri
    path = Path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return str(path)


def iter_lines(stream: BinaryIO, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
    """Lines (without the newline) of a binary stream, read in fixed chunks (memory ~ the longest line)."""
    rest = b""
    while True:
        chunk = stream.read(chunk_bytes)
        if not chunk:
            break
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        yield from lines
    if rest:
        yield rest


# ---- checksums ------------------------------------------------------------------------------------------

MANIFEST = "checksums.json"


class ChecksumError(ValueError):
    """Bytes that do not match the sha256 recorded when they were written: refuse them."""


def sha256_file(path: str | Path, block: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(directory: str | Path) -> dict:
    """Record the sha256 of every file under `directory` in `directory/checksums.json`."""
    directory = Path(directory)
    files = {str(p.relative_to(directory)): sha256_file(p) for p in sorted(directory.rglob("*"))
             if p.is_file() and p.name != MANIFEST}
    manifest = {"algorithm": "sha256", "files": files}
    write_bytes(directory / MANIFEST, json.dumps(manifest, indent=1).encode())
    return manifest


def verify_manifest(directory: str | Path) -> None:
    """Raise ChecksumError unless every file listed in checksums.json is present with its sha256."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.exists():
        raise ChecksumError(f"{directory} has no {MANIFEST}: it was not saved by Evergreen (or lost it); "
                            "re-save it with tasks.policy.model.save_model")
    expected = json.loads(path.read_text())["files"]
    bad = [name for name, digest in expected.items()
           if not (directory / name).is_file() or sha256_file(directory / name) != digest]
    if bad:
        raise ChecksumError(f"{directory}: checksum mismatch or missing file for {', '.join(bad)}; "
                            "the artifact is corrupt or was modified after it was saved: refusing to load it")
