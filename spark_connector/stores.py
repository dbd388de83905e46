"""Where staged batches live: a local or mounted path, or the storage Spark clusters use.

``stagingPath`` is a URI as Spark users write them, resolved by :func:`open_store`:

* a path, or ``file://``: the local (or mounted: NFS, a volume) filesystem.
  A relative path is made absolute on the driver, before executors see it.
* ``s3://``, ``s3a://``, ``s3n://``: S3 (or anything that speaks it: MinIO, Ceph).
* ``gs://``, ``gcs://``: Google Cloud Storage.
* ``abfs://``, ``abfss://``: Azure Data Lake Storage / Blob Storage.
* ``hdfs://``, ``viewfs://``: HDFS (pyarrow's ``HadoopFileSystem``: libhdfs and a
  Hadoop ``CLASSPATH`` on every node, as pyarrow documents).
* any other scheme that fsspec knows, when fsspec and its driver are installed.

All of them go through ``pyarrow.fs``, configured by the standard chains and
environment (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, instance profiles,
``GOOGLE_APPLICATION_CREDENTIALS``, ``AZURE_STORAGE_ACCOUNT_KEY``, ...), plus
options named ``staging.<argument>`` for what those do not cover: each is
passed to the filesystem's constructor (``staging.endpoint_override``,
``staging.region``, ``staging.access_key``...).

A store offers what staging needs: read, durable write (the reader sees the
whole object or none), list, remove, and **create-if-absent** (the first
writer wins; executor fetch mode's rule for a part file two task attempts
write).  Create-if-absent is ``link(2)`` on a POSIX path and a conditional
``PUT`` (``If-None-Match: *``, answered 412 when the key exists) on S3, through
boto3 since pyarrow's S3 filesystem cannot send that header.  The other
object stores have no such create here: executor fetch mode refuses them
before the first batch (driver fetch mode, where only the driver writes,
works on all).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from .options import OptionError

__all__ = ["Store", "LocalStore", "ArrowStore", "open_store", "absolute_uri", "explain"]

_S3 = ("s3", "s3a", "s3n")
_GCS = ("gs", "gcs")
_AZURE = ("abfs", "abfss")
_HDFS = ("hdfs", "viewfs")


def absolute_uri(uri: str) -> str:
    """``uri`` as executors must see it: a local path made absolute (here, on
    the driver, whose working directory is not theirs), URIs unchanged."""
    scheme = urlsplit(uri).scheme
    if scheme == "file":
        return "file://" + os.path.abspath(urlsplit(uri).path)
    if scheme and len(scheme) > 1:  # "C:" is a drive, not a scheme
        return uri
    return os.path.abspath(uri)


class Store:
    """A directory tree of small files, addressed by ``/``-separated keys."""

    uri: str
    #: Whether :meth:`create` is available (first writer wins).
    exclusive: bool = False
    #: How staged batches are compressed here (an Arrow IPC codec, or None):
    #: a remote store pays for every byte on the network (and a PUT of a
    #: 100k-job batch is ~18 MB of 100-byte bodies), where zstd shrinks job
    #: bodies 3-10x for ~0.1-0.3 us of CPU per job; a local disk writes at
    #: memory speed, where that CPU would be spent for nothing.
    compression: str | None = "zstd"

    def read(self, key: str) -> bytes | None:
        raise NotImplementedError

    def write(self, key: str, data: bytes | memoryview) -> None:
        """Create or replace ``key``, durably; readers see all of it or none."""
        raise NotImplementedError

    def create(self, key: str, data: bytes | memoryview) -> bool:
        """Create ``key`` unless it exists; True if this call created it."""
        raise NotImplementedError

    def exists(self, key: str) -> bool:
        raise NotImplementedError

    def children(self, key: str = "") -> list[str]:
        """Names directly under ``key`` (files and directories)."""
        raise NotImplementedError

    def remove_tree(self, key: str) -> None:
        raise NotImplementedError

    def check(self) -> None:
        """Fail now, with a clear error, if the store cannot be written."""
        probe = f".probe-{uuid.uuid4().hex}"
        try:
            self.write(probe, b"")
            self.remove_tree(probe)
        except Exception as exc:
            raise OptionError("stagingPath", f"{self.uri} cannot be written: "
                              f"{explain(exc)}") from None

    def check_create(self) -> None:
        """Fail now if :meth:`create` cannot be used here (a missing library,
        credentials or bucket), with an error naming what is missing.

        What executor fetch mode runs before its first GETJOB: a task that
        fetched jobs and then could not publish them would leave them leased
        until their RETRY.
        """
        probe = f".probe-{uuid.uuid4().hex}"
        try:
            self.create(probe, b"")
            self.remove_tree(probe)
        except Exception as exc:
            raise OptionError("stagingPath", f"{self.uri} cannot take a first-writer-wins "
                              f"create (fetchMode=executor): {explain(exc)}") from None


def explain(exc: BaseException) -> str:
    """What a store's error says is missing, in front of the error itself."""
    text = f"{type(exc).__name__}: {exc}"
    name = type(exc).__name__
    code = ""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = str(response.get("Error", {}).get("Code", ""))
    if isinstance(exc, ImportError) or "boto3" in str(exc):
        return f"boto3 is missing (pip install boto3): {text}"
    if name in ("NoCredentialsError", "PartialCredentialsError") or code in (
            "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken") or (
            "ACCESS_DENIED" in str(exc) or "InvalidAccessKeyId" in str(exc)):
        return ("the credentials are missing or refused (AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, an instance profile, or the options "
                f"staging.access_key and staging.secret_key): {text}")
    if code == "NoSuchBucket" or "NO_SUCH_BUCKET" in str(exc) or "NoSuchBucket" in str(exc):
        return f"the bucket does not exist: {text}"
    if name in ("EndpointConnectionError", "ConnectTimeoutError") or (
            "NETWORK_CONNECTION" in str(exc) or "Couldn't connect" in str(exc)):
        return ("the endpoint cannot be reached (AWS_ENDPOINT_URL, or the option "
                f"staging.endpoint_override): {text}")
    return text


# ---------------------------------------------------------------------------
# A POSIX path (local, NFS, a mounted volume)
# ---------------------------------------------------------------------------

def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalStore(Store):
    """Every file written to a temporary name, fsync'ed, then named atomically;
    the directory fsync'ed after: a crash leaves the whole file or none."""

    exclusive = True
    compression = None

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.uri = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / key if key else self.root

    def _temp(self, path: Path, data: bytes | memoryview) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".tmp-{uuid.uuid4().hex}"
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return tmp

    def read(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    def write(self, key: str, data: bytes | memoryview) -> None:
        path = self._path(key)
        os.replace(self._temp(path, data), path)
        _fsync_dir(path.parent)

    def create(self, key: str, data: bytes | memoryview) -> bool:
        # link(2) fails when the target exists: atomic "first writer wins"
        # even between processes on different hosts of one NFS export.
        path = self._path(key)
        tmp = self._temp(path, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        _fsync_dir(path.parent)
        return True

    def exists(self, key: str) -> bool:
        return self._path(key).exists()

    def children(self, key: str = "") -> list[str]:
        try:
            return [entry.name for entry in self._path(key).iterdir()]
        except FileNotFoundError:
            return []

    def remove_tree(self, key: str) -> None:
        import shutil

        path = self._path(key)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    def check(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OptionError("stagingPath", f"{self.uri} cannot be created: {exc}") from None
        if not os.access(self.root, os.W_OK):
            raise OptionError("stagingPath", f"{self.uri} is not writable")


# ---------------------------------------------------------------------------
# Object stores and HDFS, through pyarrow.fs
# ---------------------------------------------------------------------------

class ArrowStore(Store):
    """A ``pyarrow.fs`` filesystem under ``base`` (``bucket/prefix`` on object stores).

    An object store shows a written object whole or not at all (a PUT is
    atomic), which is the durability staging needs; HDFS shows a file while
    it is written, so there a file is written under a temporary name and
    renamed (a rename is atomic on HDFS).
    """

    def __init__(self, fs: pafs.FileSystem, base: str, uri: str, *,
                 create: Callable[[str, bytes | memoryview], bool] | None = None) -> None:
        self.fs = fs
        self.base = base.rstrip("/")
        self.uri = uri
        self._create = create
        self.exclusive = create is not None
        self._rename = fs.type_name == "hdfs"

    def _path(self, key: str) -> str:
        return f"{self.base}/{key}" if key else self.base

    def read(self, key: str) -> bytes | None:
        try:
            with self.fs.open_input_stream(self._path(key)) as stream:
                return bytes(stream.read())
        except FileNotFoundError:
            return None

    def write(self, key: str, data: bytes | memoryview) -> None:
        path = self._path(key)
        target = f"{path}.tmp-{uuid.uuid4().hex}" if self._rename else path
        with self.fs.open_output_stream(target) as stream:
            stream.write(data)
        if self._rename:
            self.fs.move(target, path)

    def create(self, key: str, data: bytes | memoryview) -> bool:
        if self._create is None:
            raise NotImplementedError(f"no create-if-absent on {self.uri}")
        return self._create(self._path(key), data)

    def exists(self, key: str) -> bool:
        return self.fs.get_file_info(self._path(key)).type != pafs.FileType.NotFound

    def children(self, key: str = "") -> list[str]:
        selector = pafs.FileSelector(self._path(key), allow_not_found=True)
        return [info.base_name for info in self.fs.get_file_info(selector)]

    def remove_tree(self, key: str) -> None:
        path = self._path(key)
        info = self.fs.get_file_info(path)
        if info.type == pafs.FileType.Directory:
            self.fs.delete_dir(path)
        elif info.type == pafs.FileType.File:
            self.fs.delete_file(path)


def _typed(value: str) -> Any:
    """An option's text as the constructor argument it stands for."""
    lowered = value.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        return value


#: boto3's names for the S3FileSystem arguments both need.
_BOTO3_ARGS = {"endpoint_override": "endpoint_url", "region": "region_name",
               "access_key": "aws_access_key_id", "secret_key": "aws_secret_access_key",
               "session_token": "aws_session_token"}


def _s3_endpoint() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def _s3_store(uri: str, bucket_path: str, args: dict[str, Any]) -> ArrowStore:
    if "endpoint_override" not in args and _s3_endpoint():
        args["endpoint_override"] = _s3_endpoint()
    fs = pafs.S3FileSystem(**args)

    def create(path: str, data: bytes | memoryview) -> bool:
        return _s3_put_if_absent(args, path, data)

    return ArrowStore(fs, bucket_path, uri, create=create)


_boto3_clients: dict[tuple[tuple[str, Any], ...], Any] = {}


def _s3_put_if_absent(args: Mapping[str, Any], path: str, data: bytes | memoryview) -> bool:
    """``PUT`` with ``If-None-Match: *``: S3 answers 412 when the key exists."""
    try:
        import boto3
        from botocore.exceptions import ClientError
    except ImportError:
        raise ImportError("fetchMode=executor with stagingPath on S3 needs boto3 on every "
                          "node (pip install boto3)", name="boto3") from None
    key = tuple(sorted(args.items()))
    client = _boto3_clients.get(key)
    if client is None:
        client = _boto3_clients[key] = boto3.client(
            "s3", **{_BOTO3_ARGS[name]: value for name, value in args.items()
                     if name in _BOTO3_ARGS})
    bucket, _, object_key = path.partition("/")
    try:
        client.put_object(Bucket=bucket, Key=object_key, Body=bytes(data), IfNoneMatch="*")
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "412"):
            return False
        # 409 ConditionalRequestConflict: a concurrent conditional write of the
        # same key is in flight; the other writer wins.
        if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 409:
            return False
        raise
    return True


def open_store(uri: str, options: Mapping[str, str] = {}) -> Store:
    """The store of ``stagingPath`` (already absolute), ``staging.*`` options applied.

    Unknown schemes fail here with an error naming the option.
    """
    parts = urlsplit(uri)
    scheme = parts.scheme.lower() if len(parts.scheme) > 1 else ""
    args = {name: _typed(value) for name, value in options.items()}
    if scheme in ("", "file"):
        return LocalStore(parts.path if scheme else uri)
    location = parts.netloc + parts.path
    try:
        if scheme in _S3:
            return _s3_store(uri, location, args)
        if scheme in _GCS:
            return ArrowStore(pafs.GcsFileSystem(**args), location, uri)
        if scheme in _AZURE:
            if args:
                account = parts.netloc.partition("@")[2].split(".")[0]
                fs = pafs.AzureFileSystem(**{"account_name": account, **args})
                return ArrowStore(fs, parts.netloc.partition("@")[0] + parts.path, uri)
            fs, path = pafs.FileSystem.from_uri(uri)
            return ArrowStore(fs, path, uri)
        if scheme in _HDFS:
            if args:
                fs = pafs.HadoopFileSystem(parts.hostname or "default", parts.port or 0, **args)
                return ArrowStore(fs, parts.path, uri)
            fs, path = pafs.FileSystem.from_uri(uri)
            return ArrowStore(fs, path, uri)
    except (OSError, TypeError, ValueError) as exc:
        raise OptionError("stagingPath", f"{uri}: the filesystem cannot be opened: "
                          f"{type(exc).__name__}: {exc}") from None
    return _fsspec_store(uri, scheme, location, args)


def _fsspec_store(uri: str, scheme: str, location: str, args: dict[str, Any]) -> Store:
    known = ", ".join(["file", *_S3, *_GCS, *_AZURE, *_HDFS])
    try:
        import fsspec
        from pyarrow.fs import FSSpecHandler, PyFileSystem

        fs = PyFileSystem(FSSpecHandler(fsspec.filesystem(scheme, **args)))
    except (ImportError, ValueError) as exc:
        raise OptionError("stagingPath", f"{uri} has the scheme '{scheme}', which the "
                          f"connector does not know ({known}; or a scheme fsspec knows, "
                          f"with fsspec installed): {exc}") from None
    return ArrowStore(fs, location, uri)
