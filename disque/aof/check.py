"""``disque-check-aof [--fix] FILE``: check an append-only file and repair it.

Without ``--fix`` the file is only read: every record is parsed and its
checksum verified, and the tool reports the records, the jobs the file
would load, and each damaged region with its byte offsets.  The exit status
is 0 for a sound file, 1 for a damaged one, 2 for usage errors.

With ``--fix`` a damaged file is rewritten without its damaged regions: a
torn last record is cut off; damage in the middle is skipped up to the next
record whose checksum is valid (records of the original's format, which have
no checksum, are only trusted when their job blob parses).  The original file
is kept as ``FILE.bak``.  Skipping a region loses the records in it: a lost
``LOADJOB`` loses a job, a lost ``DELJOB`` brings a deleted job back (it will
be delivered again: at-least-once); the tool names what it can recognise.
"""

from __future__ import annotations

import argparse
import mmap
import os
import sys

from ..job import SerializationError
from ..job_options import decode_stored
from .reader import AofReader, Damage, Record
from .records import KIND_DELJOB, KIND_IDMP, KIND_LOADJOB, KIND_MARK, KIND_QLIMIT

__all__ = ["main", "check"]


def check(path: str, out=sys.stdout) -> tuple[list[Damage], int, AofReader | None, object]:
    """Print a report; return the damaged regions and the file size."""
    size = os.path.getsize(path)
    if size == 0:
        print(f"{path}: empty file, nothing to check", file=out)
        return [], 0, None, None
    fh = open(path, "rb")  # noqa: SIM115 - closed by the caller through the mmap
    mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    fh.close()
    reader = AofReader(mm)
    damages: list[Damage] = []
    counts = {KIND_LOADJOB: 0, KIND_DELJOB: 0, KIND_MARK: 0, KIND_IDMP: 0, KIND_QLIMIT: 0}
    jobs: set[bytes] = set()
    bad_jobs = 0
    legacy = 0
    for item in reader.scan():
        if isinstance(item, Damage):
            damages.append(item)
            what = "damaged end" if item.tail else "corrupted region"
            print(f"{what}: bytes {item.offset}..{item.end} ({item.end - item.offset} bytes): "
                  f"{item.reason}; looks like {reader.describe(item)}", file=out)
            continue
        assert isinstance(item, Record)
        counts[item.kind] += 1
        legacy += not item.checked
        if item.kind == KIND_LOADJOB:
            try:
                job = decode_stored(item.args[0])
            except SerializationError as err:
                bad_jobs += 1
                print(f"bad job blob in the record at offset {item.offset}: {err}", file=out)
                continue
            jobs.add(job.id)
        elif item.kind == KIND_DELJOB:
            jobs.difference_update(item.args)
    print(f"{path}: {size} bytes, {sum(counts.values())} records ({counts[KIND_LOADJOB]} "
          f"LOADJOB, {counts[KIND_DELJOB]} DELJOB, {counts[KIND_MARK]} MARK; {legacy} without "
          f"checksum), {len(jobs)} jobs would load", file=out)
    if counts[KIND_IDMP]:
        print(f"{counts[KIND_IDMP]} IDMP key records (idempotent ADDJOB)", file=out)
    if counts[KIND_QLIMIT]:
        print(f"{counts[KIND_QLIMIT]} QLIMIT records (queue rate limits)", file=out)
    if bad_jobs:
        print(f"{bad_jobs} records hold a job that cannot be parsed", file=out)
    return damages, size, reader, mm


def fix(path: str, damages: list[Damage], reader: AofReader, out=sys.stdout) -> None:
    keep: list[tuple[int, int]] = []
    pos = 0
    for damage in damages:
        keep.append((pos, damage.offset))
        pos = damage.end
    keep.append((pos, reader.size))
    tmp = f"{path}.fix-{os.getpid()}"
    with open(tmp, "wb") as fh:
        for start, end in keep:
            if end > start:
                fh.write(reader.buf[start:end])
        fh.flush()
        os.fsync(fh.fileno())
        new_size = fh.tell()
    os.replace(path, f"{path}.bak")
    os.replace(tmp, path)
    dropped = sum(d.end - d.offset for d in damages)
    print(f"Successfully repaired {path}: dropped {dropped} bytes in {len(damages)} region(s), "
          f"{new_size} bytes left; the original file is {path}.bak", file=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="disque-check-aof",
        description="Check a Disque append-only file and optionally repair it.")
    parser.add_argument("--fix", action="store_true",
                        help="remove damaged records (the original is kept as FILE.bak)")
    parser.add_argument("file", help="the append-only file")
    args = parser.parse_args(argv)
    try:
        damages, _size, reader, mm = check(args.file)
    except OSError as err:
        print(f"Cannot open {args.file}: {err.strerror}", file=sys.stderr)
        return 2
    try:
        if not damages:
            print("AOF is valid")
            return 0
        if not args.fix:
            print(f"AOF is not valid: first damage at byte offset {damages[0].offset}. "
                  f"Use --fix to repair it.")
            return 1
        assert reader is not None
        fix(args.file, damages, reader)
        return 0
    finally:
        if mm is not None:
            reader = None
            mm.close()  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
