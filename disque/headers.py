"""Job headers (an extension, docs/EXTENSIONS.md): the rules a job's headers
follow when a client gives them.

``ADDJOB ... HEADER name value`` (repeatable) attaches inert metadata to a
job: a trace context, a tenant, a schema version.  The node never reads
them; it stores them with the job (``JobExt.headers``, encoded in the job's
extension record by :mod:`disque.job_options`) and hands them back with
``GETJOB ... WITHHEADERS`` and ``SHOW``.

* A **name** is text: non-empty UTF-8 without control characters (U+0000 to
  U+001F, U+007F to U+009F); case-sensitive, as Kafka's and NATS's are
  (``traceparent`` and ``Traceparent`` are two headers).  A name may repeat:
  the headers keep their order, as Kafka's record headers do.
* A **value** is binary-safe: any bytes, empty included.
* **Limits** (checked when a client adds the job, once, before anything is
  stored): at most ``max-job-headers`` headers, and at most
  ``max-job-headers-size`` bytes of names and values together.  Copies from
  other nodes are taken as they come: a peer with larger limits accepted
  them, and refusing its copy would lose the job's replication.

The defaults (config.py), 64 headers and 64 KiB: room for a trace context
(``traceparent`` + ``tracestate``, under 600 bytes) and dozens of tags, as
Pub/Sub's 100 attributes and Service Bus's 64 KB of properties give, while
a job's metadata stays far below what one ADDJOB may carry (Kafka and NATS
count headers in their 1 MB message limit, SQS in its 256 KiB one).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

__all__ = ["name_refusal", "limits_refusal", "headers_size"]

#: The C0 and C1 control characters and DEL (Unicode category Cc).
_CONTROL: Final = re.compile("[\x00-\x1f\x7f-\x9f]")

_EMPTY: Final = "ERR HEADER name can't be empty"
_NOT_UTF8: Final = "ERR HEADER name must be UTF-8 text"
_CONTROL_CHARACTER: Final = "ERR HEADER name must not contain control characters"


def name_refusal(name: bytes) -> str | None:
    """Why ``name`` cannot name a header (an ``-ERR`` text), or None."""
    if not name:
        return _EMPTY
    ascii_only = True
    for byte in name:  # compiled, a loop in C: the usual (ASCII) name is never decoded
        if byte < 0x20 or byte == 0x7F:
            return _CONTROL_CHARACTER
        if byte >= 0x80:
            ascii_only = False
            break
    if ascii_only:
        return None
    try:
        text = name.decode("utf-8")
    except UnicodeDecodeError:
        return _NOT_UTF8
    if _CONTROL.search(text) is not None:
        return _CONTROL_CHARACTER
    return None


def headers_size(headers: Sequence[bytes]) -> int:
    """Bytes of names and values together (what ``max-job-headers-size`` bounds)."""
    size = 0
    for item in headers:
        size += len(item)
    return size


def limits_refusal(headers: Sequence[bytes], max_count: int, max_size: int) -> str | None:
    """Why ``headers`` (flat: name, value, ...) exceed the limits, or None."""
    count = len(headers) // 2
    if count > max_count:
        return (f"ERR too many headers: {count}, at most {max_count} per job "
                "(max-job-headers)")
    size = headers_size(headers)
    if size > max_size:
        return (f"ERR headers too large: {size} bytes of names and values, at most "
                f"{max_size} per job (max-job-headers-size)")
    return None
