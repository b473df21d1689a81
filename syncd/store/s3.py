"""An S3-compatible store through botocore (AWS, R2, B2, MinIO, SeaweedFS)."""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, cast

from syncd.errors import (
    AlreadyExists,
    NoSuchStore,
    NotFound,
    PreconditionFailed,
    StoreError,
    TransientError,
)
from syncd.store.base import ObjectInfo, check_key

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

_TRANSIENT_CODES = {"SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout",
                    "RequestTimeTooSkewed", "Throttling", "ThrottlingException"}


# One client per process and configuration, shared by every store opened with it (a
# botocore client is thread-safe): building one costs ~0.3 s of CPU, and a daemon opens
# the store for its engine, its follower and its metrics. Keyed by process too: a forked
# child must not share the parent's connections.
_clients: dict[tuple[object, ...], Future[S3Client]] = {}
_clients_lock = threading.Lock()


def _client(endpoint_url: str | None, region: str | None, timeout: float,
            connect_timeout: float) -> Future[S3Client]:
    """The client of this configuration: built once, in a thread of its own, the first
    time a store asks for it (again only if that build failed)."""
    key = (os.getpid(), endpoint_url, region, timeout, connect_timeout)
    with _clients_lock:
        got = _clients.get(key)
        if got is not None and not (got.done() and got.exception() is not None):
            return got
        fut: Future[S3Client] = Future()
        _clients[key] = fut
    # Importing botocore and building a client takes ~0.4 s of start-up: a thread does
    # it while the caller goes on (a first seed reads and compresses meanwhile), and the
    # first request waits for it.
    threading.Thread(target=_build, args=(fut, endpoint_url, region, timeout, connect_timeout),
                     name="syncd-s3-client", daemon=True).start()
    return fut


def _build(fut: Future[S3Client], endpoint_url: str | None, region: str | None,
           timeout: float, connect_timeout: float) -> None:
    try:
        # botocore is imported here, not at module load: the local store never pays for
        # it. Not through boto3, whose import also brings s3transfer (~0.15 s of CPU at
        # every start, for upload helpers syncd never calls); the client is the same.
        import botocore.session
        from botocore.config import Config

        config = Config(
            s3={"addressing_style": "path"},
            # Non-AWS endpoints reject or mangle the SDK's default CRC trailers.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            # One SDK attempt: RetryStore does backoff, and the SDK's retry quota drains
            # in outages. (Its "max_attempts" counts retries: 1 would mean two tries.)
            retries={"total_max_attempts": 1, "mode": "standard"},
            # As many connections kept as reads in flight (heads are read 32 at a
            # time): beyond the default 10, each is opened and dropped per request. The
            # client is shared by the process's stores: room for two such reads at once
            # (a daemon's trees follow in parallel); a connection is opened only when
            # needed.
            max_pool_connections=64,
            connect_timeout=connect_timeout,
            read_timeout=timeout,
        )
        # A session of its own: a shared default session is not safe across threads.
        fut.set_result(cast("S3Client", botocore.session.Session().create_client(
            "s3", endpoint_url=endpoint_url, region_name=region or "us-east-1",
            config=config)))
    except Exception as e:
        fut.set_exception(e)


class S3Store:
    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 region: str | None = None, timeout: float = 30.0,
                 connect_timeout: float = 10.0) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.url = f"s3://{bucket}/{self.prefix}"
        self._client = _client(endpoint_url, region, timeout, min(timeout, connect_timeout))

    @property
    def _s3(self) -> S3Client:
        try:
            return self._client.result()
        except Exception as e:  # the client could not be built: no retry helps
            raise StoreError(f"{self.url}: cannot set up the S3 client: {e}") from None

    def _key(self, key: str) -> str:
        return self.prefix + check_key(key)

    def _error(self, key: str, e: Exception, if_match: str | None = None) -> StoreError:
        if isinstance(e, StoreError):  # the client could not be built: no retry helps
            return e
        from botocore.exceptions import ClientError

        where = f"{self.url}{key}"
        if isinstance(e, ClientError):
            err: Any = e.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = self._status(e)
            if code == "NoSuchBucket":
                # Not a missing key: every key of this store is missing (a typo in the URL,
                # or a bucket not created yet). A HEAD's 404 has no body to say so.
                return self.no_bucket()
            if if_match is not None and (status in (404, 412) or code in (
                    "PreconditionFailed", "NoSuchKey")):
                # AWS answers 404 to If-Match on a missing key, SeaweedFS 412: both mean
                # "not the version you read".
                return PreconditionFailed(f"{where}: changed or gone since it was read "
                                          f"(conditional replace: {code or status})")
            if status == 412 or code == "PreconditionFailed":
                return AlreadyExists(f"{where}: already exists")
            if status == 404 or code in ("NoSuchKey", "404", "NotFound"):
                return NotFound(f"{where}: not found")
            if status == 409 or code == "ConditionalRequestConflict":
                # Two conditional writes raced; the retry gets a definite answer.
                return TransientError(f"{where}: {code or status} (concurrent conditional "
                                      "write)")
            msg = f"{where}: {code or status} {err.get('Message', '')}".rstrip()
            if status >= 500 or status == 429 or code in _TRANSIENT_CODES:
                return TransientError(msg)
            return StoreError(msg)
        # Connection refused/reset, timeouts, truncated bodies: worth another try.
        return TransientError(f"{where}: {type(e).__name__}: {e}")

    def no_bucket(self) -> NoSuchStore:
        return NoSuchStore(f"store {self.url}: bucket {self.bucket!r} does not exist "
                           "(create it, or fix the store URL)")

    def put(self, key: str, data: bytes, *, if_none_match: bool = True,
            if_match: str | None = None) -> str:
        md5 = base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()
        extra: dict[str, str] = {}
        if if_match is not None:
            extra["IfMatch"] = if_match
        elif if_none_match:
            extra["IfNoneMatch"] = "*"
        full = self._key(key)
        try:
            resp = self._s3.put_object(Bucket=self.bucket, Key=full, Body=data,
                                       ContentMD5=md5, **extra)  # type: ignore[arg-type]
        except Exception as e:
            raise self._error(key, e, if_match) from e
        return str(resp.get("ETag", ""))

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        kw: dict[str, str] = {"Key": self._key(key)}
        if start < 0:
            kw["Range"] = f"bytes={start}"
        elif length is not None:
            if length == 0:
                return b""
            kw["Range"] = f"bytes={start}-{start + length - 1}"
        elif start:
            kw["Range"] = f"bytes={start}-"
        # What the range asks for, and never more: an endpoint that ignores Range would
        # otherwise make a bounded read take the whole object.
        cap = -start if start < 0 else length
        try:
            resp = self._s3.get_object(Bucket=self.bucket, **kw)  # type: ignore[arg-type]
            body = resp["Body"]
            try:
                status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode", 206)
                if "Range" in kw and status != 206 and start != 0:
                    raise StoreError(f"{self.url}{key}: the endpoint answered a ranged GET "
                                     f"with HTTP {status} (the whole object?): refusing it")
                data = body.read() if cap is None else body.read(cap)
            finally:
                body.close()
        except Exception as e:
            if self._status(e) == 416:  # a range past the end: no bytes, as a file gives
                return b""
            raise self._error(key, e) from e
        return data

    @staticmethod
    def _status(e: Exception) -> int:
        """The HTTP status of a botocore error (0: none)."""
        response = getattr(e, "response", None)
        if not isinstance(response, dict):
            return 0
        return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))

    def head(self, key: str) -> ObjectInfo | None:
        full = self._key(key)
        try:
            resp = self._s3.head_object(Bucket=self.bucket, Key=full)
        except Exception as e:
            err = self._error(key, e)
            if isinstance(err, NotFound):
                return None
            raise err from e
        return ObjectInfo(key, int(resp["ContentLength"]), str(resp.get("ETag", "")))

    def list(self, prefix: str, start_after: str = "") -> Iterator[ObjectInfo]:
        kw: dict[str, str] = {"Bucket": self.bucket, "Prefix": self.prefix + prefix}
        if start_after:
            kw["StartAfter"] = self.prefix + start_after
        try:
            for page in self._s3.get_paginator("list_objects_v2").paginate(**kw):  # type: ignore[arg-type]
                for obj in page.get("Contents", []):
                    yield ObjectInfo(obj["Key"][len(self.prefix):], int(obj["Size"]),
                                     str(obj.get("ETag", "")))
        except Exception as e:
            raise self._error(prefix, e) from e

    def prefixes(self, prefix: str) -> Iterator[str]:
        kw = {"Bucket": self.bucket, "Prefix": self.prefix + prefix, "Delimiter": "/"}
        try:
            for page in self._s3.get_paginator("list_objects_v2").paginate(**kw):  # type: ignore[arg-type]
                for p in page.get("CommonPrefixes", []):
                    yield p["Prefix"][len(self.prefix):]
        except Exception as e:
            raise self._error(prefix, e) from e

    def delete_many(self, keys: Iterable[str]) -> None:
        names = list(keys)
        for i in range(0, len(names), 1000):
            chunk = names[i : i + 1000]
            try:
                resp = self._s3.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": self._key(k)} for k in chunk],
                            "Quiet": True})
            except Exception as e:
                raise self._error(chunk[0], e) from e  # named as the store names it
            if resp.get("Errors"):
                first = resp["Errors"][0]
                # S3 names the object by its full key, the prefix included (so does url).
                key = str(first.get("Key", ""))
                prefix = self._key("")
                raise StoreError(f"{self.url}{key.removeprefix(prefix)}: delete failed: "
                                 f"{first.get('Code')} {first.get('Message', '')}")
