"""Users and their permissions (ACL, an extension in the shape of Redis's).

A :class:`User` has a name, an on/off switch, passwords (kept as SHA-256
digests) or ``nopass``, the commands it may run and the queues it may
touch (glob patterns on queue names, Redis's ``~pattern``).  :class:`Acl`
is the node's table of users, with ``default``, whose password is
``requirepass``, and the count of denials.

Rules (``ACL SETUSER name rule ...``, one line of the ACL file), a subset of
Redis's::

    on | off                     may authenticate, or not
    >password | <password        add / remove a password
    #<sha256 hex> | !<sha256 hex>  the same with the digest
    nopass | resetpass           any password works / no password works
    ~pattern | allkeys | resetkeys   queues the user may touch (allkeys = ~*)
    +command | -command          allow / deny one command
    +@category | -@category      allow / deny a category (+@all, -@all)
    allcommands | nocommands     +@all / -@all
    reset                        off resetpass resetkeys nocommands

Which commands a category holds is the command table's business
(``commands/registry.py``): rules are applied with that catalog.  Patterns
follow Redis's glob: ``*``, ``?``, ``[abc]``, ``[^a]``, ``[a-z]`` and ``\\``
to escape.

Nothing here does I/O or knows about connections: the command table checks
a client's user before running a command, the ACL commands edit the table,
the server loads the ACL file at start.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from typing import Final

__all__ = ["Acl", "AclError", "Glob", "User", "DEFAULT_USER", "digest", "parse_file",
           "format_file"]

DEFAULT_USER: Final = "default"
#: A user's cache of queue verdicts is emptied when the names it holds
#: would take more than this many bytes; longer names are not cached at all
#: (matching is linear: caching is for the usual short names seen often).
_VERDICTS_MAX_BYTES: Final = 64 * 1024
_VERDICT_NAME_MAX: Final = 256
_HEX: Final = frozenset("0123456789abcdef")


class AclError(ValueError):
    """A rule, a user name or an ACL file line that cannot be applied."""


def digest(password: bytes) -> str:
    """The SHA-256 hex digest a password is kept as."""
    return hashlib.sha256(password).hexdigest()


class Glob:
    """A Redis glob (stringmatchlen's syntax) matched in linear time.

    Redis matches ``*`` by backtracking, and a regular expression with a
    ``.*`` per ``*`` backtracks the same way: ``*-*-jobs`` against a
    40,000-byte name took seconds, with the node frozen.  Here the pattern
    is cut at its stars into *segments*, each a fixed-length run of literal
    bytes, ``?`` and ``[...]`` classes (one byte each).  A name matches when
    the first segment matches at its start, the last at its end, and each
    one in between at its leftmost place after the previous one: taking the
    leftmost place never loses a match, since what follows a star can only
    gain room.  Each segment is a regular expression without quantifiers,
    so a search costs at most (name length x segment length): linear in the
    name for a given pattern.
    """

    __slots__ = ("_empty", "_first", "_last", "_middle", "_only", "_tail_len")

    def __init__(self, pattern: bytes) -> None:
        self._empty = not pattern
        segments = _segments(pattern)
        #: The whole pattern when it has no star (the segment must match all of it).
        self._only: re.Pattern[bytes] | None = None
        self._first: re.Pattern[bytes] | None = None
        self._last: re.Pattern[bytes] | None = None
        self._middle: list[re.Pattern[bytes]] = []
        self._tail_len = 0
        if len(segments) == 1:
            self._only = _compile(segments[0])
            return
        head, *middle, tail = segments
        if head:
            self._first = _compile(head)
        if tail:
            self._last = _compile(tail)
            self._tail_len = len(tail)
        self._middle = [_compile(segment) for segment in middle if segment]

    def matches(self, name: bytes) -> bool:
        if not name:
            return self._empty  # Redis: an empty name matches only the empty pattern
        only = self._only
        if only is not None:
            return only.fullmatch(name) is not None
        pos = 0
        first = self._first
        if first is not None:
            found = first.match(name)
            if found is None:
                return False
            pos = found.end()
        end = len(name) - self._tail_len
        if end < pos:
            return False
        for segment in self._middle:
            found = segment.search(name, pos, end)
            if found is None:
                return False
            pos = found.end()
        last = self._last
        return last is None or last.fullmatch(name, end) is not None


def _segments(pattern: bytes) -> list[list[bytes]]:
    """The pattern cut at its stars: each segment a list of one-byte regexes.

    The tokens are Redis's (``stringmatchlen``), quirks included: ``?`` any
    byte, ``\\x`` the byte x (a ``\\`` ending the pattern is itself),
    ``[...]`` a class (:func:`_redis_class`), several stars in a row one.
    """
    segments: list[list[bytes]] = [[]]
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == 0x2A:  # *
            if segments[-1] or len(segments) == 1:
                segments.append([])
        elif ch == 0x3F:  # ?
            segments[-1].append(b".")
        elif ch == 0x5B:  # [
            members, i = _redis_class(pattern, i + 1)
            segments[-1].append(_members_regex(members))
        else:
            if ch == 0x5C and i + 1 < n:  # \x: x literally
                i += 1
            segments[-1].append(re.escape(pattern[i:i + 1]))
        i += 1
    return segments


def _signed(byte: int) -> int:
    """A pattern byte as Redis's ``char`` compares it (signed on x86-64)."""
    return byte - 256 if byte >= 0x80 else byte


def _redis_class(pattern: bytes, start: int) -> tuple[frozenset[int], int]:
    """The bytes the class opened at ``start - 1`` matches, and the index of
    its last byte: stringmatchlen's loop, walked once for every byte value
    (what it consumes does not depend on the byte).  Its rules: ``^`` first
    negates; ``\\x`` is x; ``a-z`` a range (ends in either order, compared
    as signed chars; ``a-]`` is a range up to ``]``); the first ``]`` closes,
    so ``[]`` matches nothing; without a ``]`` the class runs to the end of
    the pattern."""
    n = len(pattern)
    i = start
    negate = i < n and pattern[i] == 0x5E  # ^
    if negate:
        i += 1
    singles: set[int] = set()
    ranges: list[tuple[int, int]] = []
    while True:
        if i < n and pattern[i] == 0x5C and n - i >= 2:  # \x
            i += 1
            singles.add(pattern[i])
        elif i < n and pattern[i] == 0x5D:  # ]
            break
        elif i >= n:  # no ]: the class ends with the pattern
            i = n - 1
            break
        elif n - i >= 3 and pattern[i + 1] == 0x2D:  # x-y
            low, high = sorted((_signed(pattern[i]), _signed(pattern[i + 2])))
            ranges.append((low, high))
            i += 2
        else:
            singles.add(pattern[i])
        i += 1
    members = {byte for byte in range(256)
               if byte in singles or any(low <= _signed(byte) <= high for low, high in ranges)}
    if negate:
        members = set(range(256)) - members
    return frozenset(members), i


def _members_regex(members: frozenset[int]) -> bytes:
    if not members:
        return b"(?!)"  # matches no byte
    return b"[" + b"".join(b"\\x%02x" % byte for byte in sorted(members)) + b"]"


def _compile(segment: list[bytes]) -> re.Pattern[bytes]:
    return re.compile(b"".join(segment), re.DOTALL)


class User:
    """One user: switch, passwords, commands and queues.

    ``unrestricted`` (every command, every queue) is what the command table
    tests on every command: for ``default`` as it is out of the box, that
    test is all the permission check costs.
    """

    __slots__ = (
        "_matchers",
        "_verdict_bytes",
        "_verdicts",
        "all_commands",
        "all_queues",
        "command_rules",
        "commands",
        "enabled",
        "name",
        "nopass",
        "passwords",
        "patterns",
        "unrestricted",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.enabled = False
        self.nopass = False
        #: SHA-256 hex digests, in the order they were added.
        self.passwords: list[str] = []
        #: The +/- command rules as applied (ACL LIST shows them).
        self.command_rules: list[str] = []
        #: The commands the rules allow (names as in the command table).
        self.commands: frozenset[str] = frozenset()
        self.all_commands = False
        #: Queue-name patterns (``~pattern``), and whether ``~*`` is among them.
        self.patterns: list[bytes] = []
        self.all_queues = False
        self.unrestricted = False
        self._matchers: list[Glob] = []
        self._verdicts: dict[bytes, bool] = {}
        self._verdict_bytes = 0

    # -- checks ----------------------------------------------------------------

    def may_run(self, command: str) -> bool:
        return self.all_commands or command in self.commands

    def may_access(self, queue: bytes) -> bool:
        """Whether a pattern of the user matches the queue name."""
        if self.all_queues:
            return True
        size = len(queue)
        if size > _VERDICT_NAME_MAX:
            return any(m.matches(queue) for m in self._matchers)
        verdicts = self._verdicts
        verdict = verdicts.get(queue)
        if verdict is None:
            verdict = any(m.matches(queue) for m in self._matchers)
            if self._verdict_bytes + size > _VERDICTS_MAX_BYTES:
                verdicts.clear()
                self._verdict_bytes = 0
            verdicts[bytes(queue)] = verdict
            self._verdict_bytes += size
        return verdict

    def forget_verdicts(self) -> None:
        """Empty the cache of queue verdicts (its patterns changed, or it is gone)."""
        self._verdicts = {}
        self._verdict_bytes = 0

    def password_ok(self, password: bytes) -> bool:
        """Whether ``password`` opens this user (its state aside).

        Every stored digest is compared, in constant time each, so the time
        does not tell which one matched or how much of one did.
        """
        if self.nopass:
            return True
        given = digest(password)
        ok = False
        for stored in self.passwords:
            ok |= _same(given, stored)
        return ok

    # -- rules -----------------------------------------------------------------

    def apply(self, rule: str, catalog: Mapping[str, frozenset[str]]) -> None:
        """Apply one rule (see the module docstring); AclError if it is not one.

        ``catalog``: category -> command names, and ``"all"`` -> every command.
        A rule with a space or a control character in it is refused,
        patterns and passwords included (Redis refuses them in patterns):
        the ACL file is one user per line, rules split on spaces, and such a
        rule would write a line that means more than the rule.
        """
        if not is_clean(rule):
            raise AclError("Syntax error: a rule can't contain spaces or control characters")
        low = rule.lower()
        if low == "on":
            self.enabled = True
        elif low == "off":
            self.enabled = False
        elif low == "nopass":
            self.nopass = True
            self.passwords = []
        elif low == "resetpass":
            self.nopass = False
            self.passwords = []
        elif rule[:1] in (">", "<"):
            self._password(rule[0], digest(rule[1:].encode("utf-8", "surrogateescape")))
        elif rule[:1] in ("#", "!"):
            hashed = rule[1:].lower()
            if len(hashed) != 64 or not _HEX.issuperset(hashed):
                raise AclError("The password hash must be exactly 64 characters and contain "
                               "only lowercase hexadecimal characters")
            self._password(">" if rule[0] == "#" else "<", hashed)
        elif rule[:1] == "~":
            self._add_pattern(rule[1:].encode("utf-8", "surrogateescape"))
        elif low == "allkeys":
            self._add_pattern(b"*")
        elif low == "resetkeys":
            self.patterns = []
            self._matchers = []
            self.all_queues = False
            self.forget_verdicts()
        elif low in ("allcommands", "nocommands"):
            self._command_rule("+@all" if low == "allcommands" else "-@all", catalog)
        elif rule[:1] in ("+", "-"):
            self._command_rule(rule[0] + low[1:], catalog)
        elif low == "reset":
            for part in ("off", "resetpass", "resetkeys", "nocommands"):
                self.apply(part, catalog)
        else:
            raise AclError("Syntax error")
        self.unrestricted = self.all_commands and self.all_queues

    def _password(self, op: str, hashed: str) -> None:
        if op == ">":
            if hashed not in self.passwords:
                self.passwords.append(hashed)
            self.nopass = False
        elif hashed in self.passwords:
            self.passwords.remove(hashed)
        else:
            raise AclError("no such password")

    def _add_pattern(self, pattern: bytes) -> None:
        if not pattern:
            raise AclError("Syntax error")
        if pattern == b"*":
            self.all_queues = True
        if pattern not in self.patterns:
            self.patterns.append(pattern)
            self._matchers.append(Glob(pattern))
        self.forget_verdicts()

    def _command_rule(self, rule: str, catalog: Mapping[str, frozenset[str]]) -> None:
        allow = rule[0] == "+"
        name = rule[1:]
        if name.startswith("@"):
            names = catalog.get(name[1:])
            if names is None:
                raise AclError("Unknown command or category name in ACL")
        elif name in catalog["all"]:
            names = frozenset((name,))
        else:
            raise AclError("Unknown command or category name in ACL")
        everything = catalog["all"]
        if name == "@all":
            # Everything before it no longer matters: +@all / -@all restart the list.
            self.command_rules = []
            self.all_commands = allow
            self.commands = everything if allow else frozenset()
        else:
            current = everything if self.all_commands else self.commands
            self.commands = current | names if allow else current - names
            self.all_commands = self.commands >= everything
        self.command_rules.append(rule)

    # -- as text ---------------------------------------------------------------

    def rules(self) -> list[str]:
        """The rules that rebuild this user (ACL LIST, the ACL file)."""
        out = ["on" if self.enabled else "off"]
        if self.nopass:
            out.append("nopass")
        out += ["#" + hashed for hashed in self.passwords]
        if self.all_queues:
            out.append("~*")
        else:
            out += ["~" + p.decode("utf-8", "surrogateescape") for p in self.patterns]
        if not self.command_rules:
            out.append("-@all")
        out += self.command_rules
        return out

    def describe(self) -> str:
        return " ".join(["user", self.name, *self.rules()])

    def copy(self) -> User:
        other = User(self.name)
        other.take(self)
        return other

    def take(self, other: User) -> None:
        """Become ``other`` (ACL SETUSER applies its rules to a copy, then
        this: every connection holding this user sees the change at once)."""
        self.enabled = other.enabled
        self.nopass = other.nopass
        self.passwords = list(other.passwords)
        self.command_rules = list(other.command_rules)
        self.commands = other.commands
        self.all_commands = other.all_commands
        self.patterns = list(other.patterns)
        self.all_queues = other.all_queues
        self.unrestricted = other.unrestricted
        self._matchers = list(other._matchers)
        self.forget_verdicts()


def _same(a: str, b: str) -> bool:
    """Constant-time equality of two hex digests."""
    return hmac.compare_digest(a, b)


def is_clean(word: str) -> bool:
    """No whitespace (Unicode's included: the ACL file is split on it) and no
    control character (C0, DEL, C1: some of them end a line for ``splitlines``)."""
    for ch in word:
        code = ord(ch)
        if code < 0x21 or 0x7F <= code < 0xA0 or ch.isspace():
            return False
    return True


def check_name(name: str) -> str:
    if not name or any(ord(ch) <= 32 or ord(ch) >= 127 for ch in name):
        raise AclError("Usernames can't contain spaces or null characters")
    return name


class Acl:
    """The node's users, ``default`` among them, and what was refused."""

    __slots__ = ("default", "denials", "users")

    def __init__(self, requirepass: str = "") -> None:
        self.users: dict[str, User] = {}
        self.default = self.users[DEFAULT_USER] = User(DEFAULT_USER)
        self.default.enabled = True
        self.default.all_commands = self.default.all_queues = self.default.unrestricted = True
        self.default.command_rules = ["+@all"]
        self.default.patterns = [b"*"]
        self.default._matchers = [Glob(b"*")]
        self.set_default_password(requirepass)
        #: (user name, reason) -> refusals; reason: "command", "queue", "auth".
        self.denials: dict[tuple[str, str], int] = {}

    def set_default_password(self, requirepass: str) -> None:
        """``requirepass`` is the default user's one password (empty: nopass)."""
        default = self.default
        default.passwords = []
        if requirepass:
            default.nopass = False
            default.passwords.append(digest(requirepass.encode("utf-8", "surrogateescape")))
        else:
            default.nopass = True

    def initial_user(self) -> User | None:
        """The user a new connection has before AUTH: ``default`` when it
        needs no password (and is on), else nobody."""
        default = self.default
        return default if default.enabled and default.nopass else None

    def denied(self, user: str, reason: str) -> None:
        key = (user, reason)
        self.denials[key] = self.denials.get(key, 0) + 1

    def denial_total(self, reason: str) -> int:
        return sum(n for (_, why), n in self.denials.items() if why == reason)

    def replace(self, users: Iterable[User]) -> list[User]:
        """Make the table ``users`` (ACL LOAD): users that stay keep their
        objects, updated; ``default`` stays whatever happens.  Returns the
        users that are gone."""
        new = {user.name: user for user in users}
        gone = [user for name, user in self.users.items()
                if name not in new and name != DEFAULT_USER]
        for name, user in new.items():
            current = self.users.get(name)
            if current is None:
                self.users[name] = user
            else:
                current.take(user)
        for user in gone:
            del self.users[user.name]
        return gone


def parse_file(text: str, catalog: Mapping[str, frozenset[str]]) -> list[User]:
    """The users of an ACL file: ``user <name> <rule> ...`` per line, blank
    lines and ``#`` comments skipped; AclError naming the line otherwise."""
    users: dict[str, User] = {}
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        try:
            if words[0] != "user" or len(words) < 2:
                raise AclError("a line must be: user <name> <rule> ...")
            name = check_name(words[1])
            if name in users:
                raise AclError(f"user {name!r} is defined twice")
            user = User(name)
            for rule in words[2:]:
                try:
                    user.apply(rule, catalog)
                except AclError as err:
                    raise AclError(f"Error in user declaration '{rule}': {err}") from None
            users[name] = user
        except AclError as err:
            raise AclError(f"line {number}: {err}") from None
    return list(users.values())


def format_file(users: Iterable[User]) -> str:
    """The ACL file of ``users`` (what ACL SAVE writes).

    Every word is checked again before it is written (rules are checked when
    applied, this keeps a file that reads back as anything else from ever
    being written): AclError names the user otherwise.
    """
    lines = []
    for user in users:
        words = ["user", user.name, *user.rules()]
        if not all(is_clean(word) for word in words):
            raise AclError(f"user {user.name!r} has a rule with a space or a control "
                           "character: not saved")
        lines.append(" ".join(words) + "\n")
    return "".join(lines)
