"""A job's body for a page: text, pretty JSON or hex, cut at a size (no I/O).

Bodies are bytes of any size (a node takes up to 512 MB by default): a page
shows at most ``limit`` bytes and says how large the body is, so a 100 MB
body costs the browser a few kilobytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["BodyView", "view_body"]


@dataclass(frozen=True)
class BodyView:
    size: int
    shown: int
    #: ``text``, ``json`` or ``hex``: what the bytes look like (the default view).
    kind: str
    text: str
    pretty_json: str | None
    hex: str

    @property
    def cut(self) -> bool:
        return self.shown < self.size

    def as_json(self) -> dict[str, object]:
        return {"size": self.size, "shown": self.shown, "cut": self.cut, "kind": self.kind,
                "text": self.text, "json": self.pretty_json, "hex": self.hex}


def _hexdump(data: bytes) -> str:
    lines = []
    for offset in range(0, len(data), 16):
        chunk = data[offset:offset + 16]
        printable = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{offset:08x}  {chunk.hex(' '):<47}  {printable}")
    return "\n".join(lines)


def view_body(body: bytes, limit: int) -> BodyView:
    """The views of ``body``'s first ``limit`` bytes."""
    head = body[:limit]
    pretty = None
    if len(body) <= limit:
        try:
            pretty = json.dumps(json.loads(head), indent=2, ensure_ascii=False)
        except (ValueError, UnicodeDecodeError, RecursionError):
            pretty = None
    try:
        text = head.decode("utf-8")
        binary = any(ord(c) < 32 and c not in "\t\r\n" for c in text)
    except UnicodeDecodeError as exc:
        # A cut may split a character: text up to it, if that is most of it.
        text = head[:exc.start].decode("utf-8") if exc.start >= len(head) - 3 else ""
        binary = exc.start < len(head) - 3
    kind = "json" if pretty is not None else ("hex" if binary else "text")
    if binary:
        text = head.decode("utf-8", "replace")
    return BodyView(len(body), len(head), kind, text, pretty, _hexdump(head[:min(limit, 4096)]))
