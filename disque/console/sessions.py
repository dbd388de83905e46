"""Who is logged in: sessions kept in memory, named by a signed cookie.

The cookie holds only a random session ID and its HMAC-SHA256 under a key
the console keeps in its data directory (or makes at start): nothing a
browser could read or change.  It is HttpOnly and SameSite=Strict, so a
page of another site can neither read it nor have it sent with a request;
every action also carries the session's CSRF token, compared in constant
time.  The user's password stays in the server's memory only, in the
session's credentials, because the console acts on the nodes *as* that
user (its clients authenticate with it); logging out, an idle session
expiring or its lifetime ending forgets it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from .nodes import Credentials

__all__ = ["Session", "SessionStore", "LoginThrottle", "COOKIE", "load_key"]

COOKIE = "disque_console"


def load_key(data_dir: Path | None) -> bytes:
    """The key cookies are signed with: kept in ``data_dir`` (mode 0600) when
    given; a key file others could read (an older console's, or copied in)
    is made private first."""
    if data_dir is None:
        return secrets.token_bytes(32)
    path = data_dir / "cookie.key"
    try:
        if path.stat().st_mode & 0o077:
            os.chmod(path, 0o600)
        key = path.read_bytes()
        if len(key) >= 32:
            return key
    except FileNotFoundError:
        pass
    key = secrets.token_bytes(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(key)
    return key


@dataclass
class Session:
    """One logged-in browser (or the anonymous one of an open cluster)."""

    id: str
    credentials: Credentials
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    created: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.monotonic)
    #: ``time.monotonic()`` at creation: the session's lifetime counts from it.
    born: float = field(default_factory=time.monotonic)
    #: Messages to show once on the next page (the result of an action).
    flashes: list[tuple[str, str]] = field(default_factory=list)

    @property
    def user(self) -> str:
        return self.credentials.user

    def check_csrf(self, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(self.csrf.encode(),
                                                   (token or "").encode())

    def flash(self, kind: str, message: str) -> None:
        self.flashes.append((kind, message))
        del self.flashes[:-5]

    def take_flashes(self) -> list[tuple[str, str]]:
        flashes, self.flashes = self.flashes, []
        return flashes


class SessionStore:
    """Sessions by ID, with signed cookie values, an idle timeout, an
    absolute lifetime and a bound on how many are kept.

    A console in front of open nodes makes a session for every request that
    comes without a cookie: those anonymous sessions are kept at most
    ``max_anonymous`` (the least recently used go first), so that a flood
    of cookie-less requests cannot grow the console's memory; all sessions
    together at most ``max_sessions``.
    """

    def __init__(self, key: bytes, idle_seconds: float, lifetime_seconds: float = 24 * 3600,
                 max_sessions: int = 10_000, max_anonymous: int = 1_000) -> None:
        self.key = key
        self.idle_seconds = idle_seconds
        self.lifetime_seconds = lifetime_seconds
        self.max_sessions = max_sessions
        self.max_anonymous = max_anonymous
        #: Least recently used first.
        self.sessions: OrderedDict[str, Session] = OrderedDict()

    def _sign(self, session_id: str) -> str:
        mac = hmac.new(self.key, session_id.encode(), hashlib.sha256).hexdigest()
        return f"{session_id}.{mac}"

    def _gone(self, session: Session, now: float) -> bool:
        return (now - session.last_seen > self.idle_seconds
                or now - session.born > self.lifetime_seconds)

    def create(self, credentials: Credentials) -> tuple[Session, str]:
        """A new session and the cookie value that names it."""
        self.expire()
        anonymous = credentials.password is None
        if anonymous:
            kept = [s for s in self.sessions.values() if s.credentials.password is None]
            for old in kept[:max(0, len(kept) - self.max_anonymous + 1)]:
                del self.sessions[old.id]  # the least recently used
        while len(self.sessions) >= self.max_sessions:
            self.sessions.popitem(last=False)
        session = Session(secrets.token_urlsafe(24), credentials)
        self.sessions[session.id] = session
        return session, self._sign(session.id)

    def find(self, cookie: str | None) -> Session | None:
        """The live session a cookie names (None: absent, forged, expired)."""
        if not cookie or "." not in cookie:
            return None
        session_id, _, _mac = cookie.partition(".")
        if not hmac.compare_digest(self._sign(session_id).encode(), cookie.encode()):
            return None
        session = self.sessions.get(session_id)
        if session is None:
            return None
        now = time.monotonic()
        if self._gone(session, now):
            del self.sessions[session_id]
            return None
        session.last_seen = now
        self.sessions.move_to_end(session_id)
        return session

    def drop(self, session: Session) -> None:
        self.sessions.pop(session.id, None)

    def expire(self) -> list[Session]:
        now = time.monotonic()
        gone = [s for s in self.sessions.values() if self._gone(s, now)]
        for session in gone:
            del self.sessions[session.id]
        return gone

    def users(self) -> set[tuple[str, str]]:
        """The credential keys of live sessions (pools still in use)."""
        return {s.credentials.key for s in self.sessions.values()}


class LoginThrottle:
    """Failed logins, counted per client address and user and per address.

    The console checks passwords with the nodes, which do not slow down a
    guesser: past ``free`` failures (per address and user, or ``free * 4``
    per address whatever the user) each further try must wait twice as long
    as the previous one, from one second up to ``longest``.  A success
    clears its address and user.  Failures older than ``window`` are
    forgotten, and at most ``entries`` keys are kept (the oldest go first),
    so a flood of addresses cannot grow the console's memory.
    """

    def __init__(self, free: int = 5, window: float = 900.0, longest: float = 300.0,
                 entries: int = 10_000) -> None:
        self.free = free
        self.window = window
        self.longest = longest
        self.entries = entries
        #: key -> (failures, monotonic time of the last one)
        self._failures: dict[tuple[str, ...], tuple[int, float]] = {}

    def _wait(self, key: tuple[str, ...], free: int, now: float) -> float:
        count, last = self._failures.get(key, (0, 0.0))
        if count <= free or now - last > self.window:
            return 0.0
        delay = min(self.longest, 2.0 ** (count - free - 1))
        return max(0.0, last + delay - now)

    def wait(self, address: str, user: str) -> float:
        """Seconds before ``user`` may try again from ``address`` (0: now)."""
        now = time.monotonic()
        return max(self._wait(("pair", address, user), self.free, now),
                   self._wait(("address", address), self.free * 4, now))

    def failed(self, address: str, user: str) -> None:
        now = time.monotonic()
        for key in (("pair", address, user), ("address", address)):
            count, last = self._failures.pop(key, (0, 0.0))
            self._failures[key] = (1 if now - last > self.window else count + 1, now)
        while len(self._failures) > self.entries:
            del self._failures[next(iter(self._failures))]

    def forgive(self, address: str, user: str) -> None:
        """Take back one :meth:`failed` (a try counted before its outcome
        was known, that turned out not to be a wrong password)."""
        for key in (("pair", address, user), ("address", address)):
            count, last = self._failures.get(key, (0, 0.0))
            if count > 1:
                self._failures[key] = (count - 1, last)
            else:
                self._failures.pop(key, None)

    def succeeded(self, address: str, user: str) -> None:
        self._failures.pop(("pair", address, user), None)
