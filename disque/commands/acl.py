"""ACL: users and their permissions (an extension in the shape of Redis's).

``ACL SETUSER/GETUSER/DELUSER/LIST/USERS/WHOAMI/CAT/SAVE/LOAD``; the users
themselves and their rules are in ``acl.py``, the check before every
command in ``registry.execute``.  The ACL file (directive ``aclfile``) is
read at start and by ACL LOAD, written by ACL SAVE.
"""

from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING, Any

from ..acl import DEFAULT_USER, AclError, User, check_name, format_file, parse_file
from ..protocol import OK, Map, ReplyError
from .registry import CommandError, acl_catalog, command

if TYPE_CHECKING:
    from ..connection import ClientConnection
    from ..state import ServerState

__all__ = ["load_acl_file"]


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _user_name(raw: bytes) -> str:
    try:
        return check_name(_text(raw))
    except AclError as err:
        raise CommandError(f"ERR {err}") from None


def _disconnect(state: ServerState, users: list[User]) -> int:
    """Close the connections authenticated as ``users`` (deleted or turned off)."""
    closed = 0
    for other in list(state.clients.values()):
        if other.user is not None and any(other.user is user for user in users):
            other.kill()
            closed += 1
    return closed


@command("acl", -2, "admin", free_subcommands="whoami cat")
def acl(state: ServerState, client: ClientConnection, argv: list[bytes]) -> Any:
    """ACL SETUSER|GETUSER|DELUSER|LIST|USERS|WHOAMI|CAT|SAVE|LOAD ..."""
    sub = argv[1].lower()
    n = len(argv)
    table = state.acl
    if sub == b"setuser" and n >= 3:
        name = _user_name(argv[2])
        current = table.users.get(name)
        draft = current.copy() if current is not None else User(name)
        catalog = acl_catalog()
        for raw in argv[3:]:
            rule = _text(raw)
            try:
                draft.apply(rule, catalog)
            except AclError as err:
                raise CommandError(f"ERR Error in ACL SETUSER modifier '{rule}': {err}") from None
        if current is None:
            table.users[name] = draft
        else:
            was_on = current.enabled
            current.take(draft)  # every connection of the user sees it at once
            if was_on and not current.enabled:
                _disconnect(state, [current])
        return OK
    if sub == b"getuser" and n == 3:
        user = table.users.get(_text(argv[2]))
        if user is None:
            return None
        flags = ["on" if user.enabled else "off"]
        if user.nopass:
            flags.append("nopass")
        rules = user.rules()
        return Map([
            b"flags", [flag.encode() for flag in flags],
            b"passwords", [hashed.encode() for hashed in user.passwords],
            b"commands", " ".join(r for r in rules if r[:1] in ("+", "-")).encode(),
            b"keys", " ".join(r for r in rules if r[:1] == "~").encode("utf-8",
                                                                       "surrogateescape"),
        ])
    if sub == b"deluser" and n >= 3:
        gone: list[User] = []
        for raw in argv[2:]:
            name = _text(raw)
            if name == DEFAULT_USER:
                raise CommandError("ERR The 'default' user cannot be removed")
        for raw in argv[2:]:
            user = table.users.pop(_text(raw), None)
            if user is not None:
                gone.append(user)
        _disconnect(state, gone)
        return len(gone)
    if sub == b"list" and n == 2:
        return [user.describe().encode("utf-8", "surrogateescape")
                for user in table.users.values()]
    if sub == b"users" and n == 2:
        return [name.encode("utf-8", "surrogateescape") for name in table.users]
    if sub == b"whoami" and n == 2:
        return client.user.name.encode() if client.user is not None else None
    if sub == b"cat" and n in (2, 3):
        catalog = acl_catalog()
        if n == 2:
            return sorted(name.encode() for name in catalog if name != "all")
        names = catalog.get(_text(argv[2]).lower().removeprefix("@"))
        if names is None:
            raise CommandError(f"ERR Unknown category '{_text(argv[2])}'")
        return sorted(name.encode() for name in names)
    if sub == b"save" and n == 2:
        path = _acl_path(state)
        try:
            text = format_file(table.users.values())
        except AclError as err:
            raise CommandError(f"ERR There was an error trying to save the ACLs: {err}") from None
        try:
            _write_atomically(path, text)
        except OSError as err:
            raise CommandError(f"ERR There was an error trying to save the ACLs: "
                               f"{err.strerror}") from None
        return OK
    if sub == b"load" and n == 2:
        _acl_path(state)
        try:
            load_acl_file(state)
        except (OSError, AclError) as err:
            raise CommandError(f"ERR Error loading the ACL file: {err}") from None
        return OK
    if sub in _SUBCOMMANDS:
        raise CommandError(f"ERR wrong number of arguments for 'acl|{sub.decode()}' command")
    shown = argv[1][:64].decode("utf-8", "replace")
    return ReplyError(f"ERR unknown subcommand '{shown}'. Try ACL SETUSER, GETUSER, DELUSER, "
                      "LIST, USERS, WHOAMI, CAT, SAVE, LOAD.")


_SUBCOMMANDS = frozenset((b"setuser", b"getuser", b"deluser", b"list", b"users", b"whoami",
                          b"cat", b"save", b"load"))


def _acl_path(state: ServerState) -> str:
    path: str = state.config.aclfile
    if not path:
        raise CommandError("ERR This node is not configured to use an ACL file: set the "
                           "aclfile directive (at start) to save and load users")
    return path


def _write_atomically(path: str, text: str) -> None:
    """A temporary file beside ``path``, fsynced, renamed over it."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".acl-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)  # password digests
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def load_acl_file(state: ServerState) -> None:
    """Replace the users with the ACL file's (at start and ACL LOAD).

    All or nothing: a line that does not parse raises AclError (naming the
    line) and changes nothing.  ``default`` stays as it is (requirepass for
    its password) unless the file defines it.  Connections of users the file
    removes or turns off are closed.
    """
    path = state.config.aclfile
    with open(path, encoding="utf-8", errors="surrogateescape") as fh:
        users = parse_file(fh.read(), acl_catalog())
    if not any(user.name == DEFAULT_USER for user in users):
        users.append(state.acl.default.copy())
    was_on = [user for user in state.acl.users.values() if user.enabled]
    gone = state.acl.replace(users)
    _disconnect(state, gone + [user for user in was_on if not user.enabled])
