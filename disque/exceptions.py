"""Every exception the Disque client raises, in one tree.

Why one tree: callers should be able to write ``except disque.DisqueError``
and catch everything the client can throw, and pick finer cases by class
instead of parsing message texts.  Server errors are matched by the first
word of the ``-ERROR`` reply (the prefix Disque clients have always matched:
the original's texts after it vary between versions); the full text stays in
``str(err)`` and ``err.message``::

    DisqueError                   base of everything below
    ├── ConnectionFailed          no node answered (after every address, retry and
    │                             backoff the client was allowed); also a builtin
    │                             ``ConnectionError``, so ``except OSError`` works
    ├── ProtocolError             a reply of a shape Disque never sends (wrong server?)
    └── ResponseError             the server answered ``-CODE text``; ``.code`` = CODE.
        │                         Errors without a specific class below (``ERR ...``
        │                         syntax/arity/option errors, unknown prefixes) are
        │                         raised as plain ``ResponseError``.
        ├── NoJob        NOJOB    the node does not know the job (WORKING, ...)
        ├── BadId        BADID    malformed job ID: nothing was done
        ├── NoRepl       NOREPL   replication level not reached (not enough nodes,
        │                         or ADDJOB's ms-timeout elapsed first)
        ├── Paused       PAUSED   queue paused in input: ADDJOB refused
        ├── Leaving      LEAVING  the node leaves the cluster: connect to another one
        │                         (the client does this itself, see ``max_retries``)
        ├── MaxLen       MAXLEN   ADDJOB ... MAXLEN n and the queue is already that long
        ├── TooLate      TOOLATE  WORKING after half of the job's TTL
        ├── OutOfMemory  OOM      the node is over its memory limit
        ├── Acked        ACKED    WORKING on an acknowledged job (this server only;
        │                         the original C server accepts it silently)
        ├── Loading      LOADING  the node is still loading its AOF
        ├── Misconf      MISCONF  the node cannot write its AOF
        ├── IdmpConflict IDMPCONFLICT  ADDJOB ... IDMP key: the key names another
        │                         job with a different body (extension)
        ├── IdmpBusy     IDMPBUSY the first ADDJOB with that IDMP key still waits
        │                         for its copies: retry later (extension)
        ├── NoPerm       NOPERM   the user may not run the command or touch the
        │                         queue (users with permissions, an extension)
        └── AuthError    AUTH failed (``ERR invalid password``, ``WRONGPASS``, or a
            │            password given to a node that has none)
            └── NoAuth   NOAUTH   a password is required and none was given

Map a raw error text to its class with :func:`error_from_reply`.
"""

from __future__ import annotations

__all__ = [
    "DisqueError", "ConnectionFailed", "ProtocolError", "ResponseError",
    "NoJob", "BadId", "NoRepl", "Paused", "Leaving", "MaxLen", "TooLate",
    "OutOfMemory", "Acked", "Loading", "Misconf", "IdmpConflict", "IdmpBusy", "NoPerm",
    "AuthError", "NoAuth",
    "ERROR_CLASSES", "error_from_reply",
]


class DisqueError(Exception):
    """Base class of every exception raised by :mod:`disque.client`."""


class ConnectionFailed(DisqueError, ConnectionError):
    """No node could be reached, or the connection kept dropping.

    ``errors`` maps each ``"host:port"`` tried to the last failure seen there,
    so a user can tell "connection refused" from "timed out" per node.
    """

    def __init__(self, message: str, errors: dict[str, BaseException] | None = None) -> None:
        super().__init__(message)
        self.errors: dict[str, BaseException] = dict(errors or {})


class ProtocolError(DisqueError):
    """The server sent a reply whose shape does not match the command."""


class ResponseError(DisqueError):
    """An error reply (``-CODE text``) from the server.

    ``code`` is the first word (``ERR``, ``NOJOB``, ...) and ``message`` the
    whole text as the server sent it.
    """

    code: str = "ERR"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        first = message.split(" ", 1)[0]
        if first:
            self.code = first


class NoJob(ResponseError):
    """``-NOJOB``: the job is not known in the context of this node."""


class BadId(ResponseError):
    """``-BADID``: a job ID is malformed; the command did nothing."""


class NoRepl(ResponseError):
    """``-NOREPL``: not enough reachable nodes, or replication timed out."""


class Paused(ResponseError):
    """``-PAUSED``: the queue is paused in input."""


class Leaving(ResponseError):
    """``-LEAVING``: the node is leaving the cluster; use another node."""


class MaxLen(ResponseError):
    """``-MAXLEN``: the queue already holds MAXLEN jobs."""


class TooLate(ResponseError):
    """``-TOOLATE``: half of the job's TTL elapsed; WORKING is refused."""


class OutOfMemory(ResponseError):
    """``-OOM``: the node is over its memory limit."""


class Acked(ResponseError):
    """``-ACKED``: the job is already acknowledged."""


class Loading(ResponseError):
    """``-LOADING``: the node is loading its data set."""


class Misconf(ResponseError):
    """``-MISCONF``: the node cannot persist writes (AOF errors)."""


class IdmpConflict(ResponseError):
    """``-IDMPCONFLICT``: the IDMP key was used in the queue, within its window,
    for a job with a different body; nothing was added."""


class IdmpBusy(ResponseError):
    """``-IDMPBUSY``: the ADDJOB that first used the IDMP key still waits for
    its copies; retry (it either answers with the job or frees the key)."""


class NoPerm(ResponseError):
    """``-NOPERM``: the connection's user may not run this command or touch
    this queue (ACL, an extension); nothing was done."""


class AuthError(ResponseError):
    """Authentication failed or is missing."""


class NoAuth(AuthError):
    """``-NOAUTH``: the node requires a password."""


#: Error prefix (first word of the reply) -> exception class.
ERROR_CLASSES: dict[str, type[ResponseError]] = {
    "NOJOB": NoJob,
    "BADID": BadId,
    "NOREPL": NoRepl,
    "PAUSED": Paused,
    "LEAVING": Leaving,
    "MAXLEN": MaxLen,
    "TOOLATE": TooLate,
    "OOM": OutOfMemory,
    "ACKED": Acked,
    "LOADING": Loading,
    "MISCONF": Misconf,
    "IDMPCONFLICT": IdmpConflict,
    "IDMPBUSY": IdmpBusy,
    "NOPERM": NoPerm,
    "NOAUTH": NoAuth,
    "WRONGPASS": AuthError,
}

# ``ERR`` texts that mean a failed AUTH (Redis and Disque wordings).
_AUTH_ERR_TEXTS = (
    "ERR invalid password",
    "ERR Client sent AUTH, but no password is set",
    "ERR AUTH <password> called without any password configured",
)


def error_from_reply(message: str) -> ResponseError:
    """The exception for an error reply text (without the leading ``-``)."""
    code = message.split(" ", 1)[0]
    cls = ERROR_CLASSES.get(code)
    if cls is None:
        cls = AuthError if message.startswith(_AUTH_ERR_TEXTS) else ResponseError
    return cls(message)
