"""The opt-in cluster secret: an HMAC on every cluster bus message.

An extension (``cluster-secret``, off by default).  Without it anything that
can reach a node's bus port (client port + 10000) is trusted as a peer: it
can MEET its way into the cluster, REPLJOB jobs into queues or DELJOB them.
With it every message carries, in the 34 reserved header bytes at offset 102
(the original Disque ignores them)::

    102  "H1"          the scheme (room for another one later)
    104  tag[32]       HMAC-SHA256(secret, the whole message with bytes
                       102..135 zeroed)

and a message whose tag does not verify is refused before it is decoded: the
link is closed and the refusal logged (rate-limited, so a hostile peer cannot
fill the disk).  The tag covers the header (type, sender, flags) and the
body, so a message cannot be forged or altered without the secret.

What it does not do: encrypt (job bodies travel in clear), or stop a
*replay*: a process that captured messages on the wire can send them again
(re-creating a copy of a job it saw replicated, re-sending its DELJOB).
Against a sniffer the bus needs a private network or an encrypted tunnel
(WireGuard, IPsec).  Every holder of the secret can also speak for any node.

Cost: one HMAC per message sent and received, about 2 us for a job-ID
message (GOTJOB, QUEUED ...) and 0.6 us per KB of job body; a message
broadcast to several links is signed once, and messages a link merges
(``messages.coalesce``) are signed once merged.  Only nodes with the secret run
any of this: with it off, the send and receive paths do not change.
"""

from __future__ import annotations

import hashlib
import hmac
import logging

from ..log import RateLimitedLog

__all__ = ["MIN_SECRET_LENGTH", "BusAuth"]

log = logging.getLogger("disque.cluster")

#: Where the tag goes: the header's reserved bytes.
FIELD_START = 102
FIELD_END = 136
SCHEME = b"H1"
_TAG_START = FIELD_START + len(SCHEME)
_ZEROS = bytes(FIELD_END - FIELD_START)

#: A shorter secret could be guessed offline from one captured message.
MIN_SECRET_LENGTH = 16


class BusAuth:
    """Signs outgoing bus messages and verifies incoming ones with the cluster secret."""

    __slots__ = ("_base", "_key", "_log", "_signed", "refused")

    def __init__(self, secret: bytes) -> None:
        self._key = secret
        # The key's inner and outer pads, computed once; each check copies them.
        self._base = hmac.new(secret, digestmod=hashlib.sha256)
        # Messages signed this turn, by identity -> (message, signed): a
        # broadcast hands the same object to each link.  The message is
        # kept in the value so that its id() is not reused meanwhile.
        self._signed: dict[int, tuple[bytes, bytes]] = {}
        self._log = RateLimitedLog(log)
        #: Messages refused since start (INFO / metrics).
        self.refused = 0

    def sign(self, message: bytes) -> bytes:
        """``message`` (encoded with its reserved bytes zero) with the tag in them."""
        done = self._signed.get(id(message))
        if done is not None and done[0] is message:
            return done[1]
        tag = hmac.digest(self._key, message, "sha256")
        signed = b"".join((message[:FIELD_START], SCHEME, tag, message[FIELD_END:]))
        self._signed[id(message)] = (message, signed)
        return signed

    def forget(self) -> None:
        """Drop the messages signed (the bus calls this when a turn's output
        is written): a big REPLJOB is not held on to afterwards."""
        self._signed.clear()

    def verify(self, frame: bytes) -> bool:
        """Whether ``frame`` (a whole message, FrameReader checked its length) is signed."""
        if frame[FIELD_START:_TAG_START] != SCHEME:
            return False
        check = self._base.copy()
        view = memoryview(frame)
        check.update(view[:FIELD_START])
        check.update(_ZEROS)
        check.update(view[FIELD_END:])
        return hmac.compare_digest(check.digest(), frame[_TAG_START:FIELD_END])

    def refuse(self, frame: bytes, peer_ip: str, type_name: str) -> None:
        """Count and log (rate-limited) a message that did not verify."""
        self.refused += 1
        unsigned = frame[FIELD_START:FIELD_END] == _ZEROS
        sender = frame[16:56].decode("ascii", "replace")
        reason = "no cluster secret" if unsigned else "a wrong cluster secret"
        self._log.warning(f"Refused cluster bus {type_name} from {peer_ip} (sender {sender}): "
                          f"{reason}; closing the link")
