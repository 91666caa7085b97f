"""One interface over a local directory and S3 (boto3, any S3-compatible endpoint).

    from tasks import storage
    storage.list_files("s3://bucket/traces/")          # sorted URIs of the objects under a prefix
    with storage.open_binary("s3://bucket/traces/2026-12-01/part-0.jsonl.gz") as f: ...   # streamed
    storage.write_bytes("runs/x/report.json", data)     # atomic: temporary name, then rename (S3: one PUT)
    storage.read_bytes("s3://bucket/report.json")       # checks the sha256 recorded at write
    storage.read_bytes("http://tools.internal/openapi.json")   # http(s) is read-only

The S3 endpoint comes from `EVERGREEN_S3_ENDPOINT_URL`, else boto3's own `AWS_ENDPOINT_URL_S3` /
`AWS_ENDPOINT_URL`, else AWS. Credentials come from boto3's usual chain and are never logged: error
messages name the bucket and key only. Transient S3 errors are retried by botocore (standard mode).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO


class ChecksumError(ValueError):
    """Bytes that do not match the sha256 recorded when they were written: refuse them."""


def is_s3(uri: str | Path) -> bool:
    return str(uri).startswith("s3://")


def is_http(uri: str | Path) -> bool:
    """http(s):// sources are read-only here (e.g. a tool service's OpenAPI document)."""
    return str(uri).startswith(("http://", "https://"))


def split_s3(uri: str) -> tuple[str, str]:
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"{uri!r} is not an s3:// URI of the form s3://bucket/key")
    return bucket, key


@functools.lru_cache(maxsize=4)
def _client(endpoint_url: str | None) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint_url, config=Config(retries={"mode": "standard", "max_attempts": 5}))


def s3_client() -> Any:
    return _client(os.environ.get("EVERGREEN_S3_ENDPOINT_URL") or None)


def list_files(uri: str | Path, suffixes: tuple[str, ...] = ()) -> list[str]:
    """Sorted URIs of the files under a directory / prefix (or the file itself), filtered by suffix."""
    uri = str(uri)
    if is_s3(uri):
        bucket, key = split_s3(uri)
        out = []
        with s3_errors(uri):
            for page in s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
                out += [f"s3://{bucket}/{o['Key']}" for o in page.get("Contents", [])]
    else:
        path = Path(uri)
        if path.is_file():
            return [str(path)]
        if not path.is_dir():
            raise FileNotFoundError(f"{path} is neither a file nor a directory: check the input path")
        out = [str(p) for p in path.rglob("*") if p.is_file()]
    return sorted(u for u in out if not suffixes or u.endswith(suffixes))


MISSING_CODES = {"NoSuchKey", "NoSuchBucket", "404", "NotFound"}
DENIED_CODES = {
    "AccessDenied",
    "403",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "AllAccessDisabled",
}


def s3_error(error: Exception, uri: str) -> Exception:
    """What an S3 failure on `uri` is: FileNotFoundError for a missing key or bucket, PermissionError for
    refused credentials, else the error itself (throttling, 5xx, a dropped connection: botocore has retried
    them; a caller must not mistake them for "no data"). botocore's messages carry no credentials."""
    if type(error).__name__ == "NoCredentialsError":  # botocore found none in its chain: nothing was sent
        return PermissionError(
            f"{uri}: no S3 credentials: set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the Airflow "
            "connection aws_default"
        )
    code = str((getattr(error, "response", None) or {}).get("Error", {}).get("Code", ""))
    if code in MISSING_CODES:
        return FileNotFoundError(f"{uri}: not found ({code})")
    if code in DENIED_CODES:
        return PermissionError(
            f"{uri}: access denied ({code}): check the credentials (AWS_* or the Airflow "
            "connection) and the bucket's policy"
        )
    return error


@contextlib.contextmanager
def s3_errors(uri: str) -> Iterator[None]:
    """S3 calls on `uri` inside raise what s3_error makes of their failures (the error itself where it maps
    to nothing else)."""
    try:
        yield
    except Exception as e:
        mapped = s3_error(e, uri)
        if mapped is e:
            raise
        raise mapped from None


def _get_object(uri: str) -> dict:
    bucket, key = split_s3(uri)
    with s3_errors(f"s3://{bucket}/{key}"):
        return s3_client().get_object(Bucket=bucket, Key=key)


def exists(uri: str | Path) -> bool:
    """Whether the file or object is there (refused credentials and outages raise, never read as "no")."""
    uri = str(uri)
    if not is_s3(uri):
        return Path(uri).exists()
    bucket, key = split_s3(uri)
    try:
        with s3_errors(uri):
            s3_client().head_object(Bucket=bucket, Key=key)
        return True
    except FileNotFoundError:
        return False


def open_binary(uri: str | Path) -> BinaryIO:
    """A readable binary stream; S3 objects are streamed, never read whole into memory."""
    uri = str(uri)
    if is_s3(uri):
        return _get_object(uri)["Body"]
    if is_http(uri):
        import urllib.request

        try:
            return urllib.request.urlopen(uri, timeout=30)
        except OSError as e:
            raise FileNotFoundError(f"cannot read {uri}: {e}") from None
    return open(uri, "rb")


SHA256_META = "sha256"  # S3 user metadata (x-amz-meta-sha256) written with every object


def check_sha256(uri: str, actual: str, response: dict) -> None:
    """Raise ChecksumError where a GET's bytes (their sha256: `actual`) differ from the sha256 the object was
    written with (its metadata; an object written elsewhere may carry none)."""
    expected = response.get("Metadata", {}).get(SHA256_META)
    if expected and actual != expected:
        raise ChecksumError(
            f"{uri}: sha256 {actual[:12]}... differs from the {expected[:12]}... recorded at "
            "write: the object changed or is corrupt"
        )


def read_bytes(uri: str | Path, verify: bool = True) -> bytes:
    """The object's bytes; an S3 object written here carries its sha256, which is checked."""
    uri = str(uri)
    if is_s3(uri) and verify:
        response = _get_object(uri)
        data = response["Body"].read()
        check_sha256(uri, hashlib.sha256(data).hexdigest(), response)
        return data
    with open_binary(uri) as f:
        return f.read()


def fsync_path(path: str | Path) -> None:
    """Flush a file's or a directory's entries to disk (a directory: the names created or renamed in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(path: str | Path) -> Iterator[BinaryIO]:
    """A file written under a temporary name beside `path`, fsynced, renamed over it only when complete, and
    the directory fsynced: a reader sees the old file or the whole new one, and a crash (power loss
    included) never leaves half a file under the real name. The one atomic write of the project."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_path(path.parent)  # the rename itself survives a crash


def publish_dir(tmp: str | Path, final: str | Path) -> Path:
    """Put the complete directory `tmp` in place as `final`: its files and itself fsynced first, then
    exchanged with an existing `final` in one step (Linux renameat2 RENAME_EXCHANGE: a reader never finds
    `final` missing or half-written), the old contents then removed. Where the exchange is not available
    (another OS or filesystem), the old directory is renamed aside first: a window of one rename."""
    import ctypes
    import shutil

    tmp, final = Path(tmp), Path(final)
    for f in [*tmp.rglob("*"), tmp]:
        fsync_path(f)
    if not final.exists():
        os.rename(tmp, final)
    else:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = getattr(libc, "renameat2", None)
        at_fdcwd, exchange = -100, 2  # AT_FDCWD, RENAME_EXCHANGE
        if (
            renameat2 is not None
            and renameat2(at_fdcwd, str(tmp).encode(), at_fdcwd, str(final).encode(), exchange) == 0
        ):
            shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the old contents
        else:
            old = final.with_name(f".{final.name}.old-{os.getpid()}")
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
    fsync_path(final.parent)
    return final


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """`data` (text is UTF-8 encoded) written to a local `path` through atomic_writer."""
    with atomic_writer(path) as f:
        f.write(data.encode() if isinstance(data, str) else data)
    return Path(path)


def write_bytes(uri: str | Path, data: bytes) -> str:
    """Write atomically: a reader sees the old object or the whole new one, never a part."""
    uri = str(uri)
    if is_s3(uri):
        bucket, key = split_s3(uri)
        # one PUT is atomic in S3; the sha256 rides along as metadata and is checked by read_bytes
        s3_client().put_object(
            Bucket=bucket, Key=key, Body=data, Metadata={SHA256_META: hashlib.sha256(data).hexdigest()}
        )
        return uri
    with atomic_writer(Path(uri)) as f:
        f.write(data)
    return uri


def upload_file(local: str | Path, uri: str, sha256: str | None = None) -> str:
    """Copy a local file to `uri`. Large files go to S3 as a multipart upload, which stays invisible
    until it completes: an interrupted upload leaves no partial object (botocore retries each part)."""
    local = Path(local)
    if not is_s3(uri):
        import shutil

        with atomic_writer(Path(uri)) as f, open(local, "rb") as src:
            shutil.copyfileobj(src, f, 1 << 20)
        return uri
    from boto3.s3.transfer import TransferConfig

    bucket, key = split_s3(uri)
    s3_client().upload_file(
        str(local),
        bucket,
        key,
        ExtraArgs={"Metadata": {SHA256_META: sha256 or sha256_file(local)}},
        Config=TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20),
    )
    return uri


def inside_dir(root: Path, relative: str, what: str) -> Path:
    """root / relative, refused (ValueError naming `what`) where it would land outside `root`: an object key
    with `..`, an absolute part or a symlink out must not write anywhere else on this machine."""
    target = (root / relative).resolve()
    if not relative or target == root or not target.is_relative_to(root):
        raise ValueError(
            f"{what} would be written to {target}, outside {root}: refused (a key with '..' or an "
            "absolute path); fix the object's key"
        )
    return target


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


# ---- manifests ------------------------------------------------------------------------------------------

MANIFEST = "checksums.json"


def sha256_file(path: str | Path, block: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(directory: str | Path) -> dict:
    """Record the sha256 of every file under `directory` in `directory/checksums.json`."""
    directory = Path(directory)
    files = {
        str(p.relative_to(directory)): sha256_file(p)
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    manifest = {"algorithm": "sha256", "files": files}
    write_bytes(directory / MANIFEST, json.dumps(manifest, indent=1).encode())
    return manifest


def verify_manifest(directory: str | Path) -> None:
    """Raise ChecksumError unless every file listed in checksums.json is present with its sha256."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.exists():
        raise ChecksumError(
            f"{directory} has no {MANIFEST}: it was not saved by Evergreen (or lost it); "
            "re-save it with tasks.policy.model.save_model"
        )
    expected = json.loads(path.read_text())["files"]
    bad = [
        name
        for name, digest in expected.items()
        if not (directory / name).is_file() or sha256_file(directory / name) != digest
    ]
    if bad:
        raise ChecksumError(
            f"{directory}: checksum mismatch or missing file for {', '.join(bad)}; "
            "the artifact is corrupt or was modified after it was saved: refusing to load it"
        )
