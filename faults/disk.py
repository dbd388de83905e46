"""Disks that fill up or fail, in a mount namespace of their own.

A :class:`SmallDisk` is an ext4 filesystem on a loop device whose backing
file lives on a tmpfs, all mounted inside a mount namespace that no other
process on the machine sees:

* **full**: :meth:`SmallDisk.fill` leaves (almost) no free block on the
  ext4 filesystem, so a ``write(2)`` fails with ENOSPC;
* **failing**: :meth:`SmallDisk.break_device` fills the tmpfs under the
  image instead.  The filesystem still believes it has room, ``write(2)``
  succeeds into the page cache, and the loop device fails the writeback of
  any block the image has no page for: ``fsync`` returns an error (the
  backing store's ENOSPC passed up, or EIO), as a dying disk does.  Blocks
  the filesystem freed (an AOF rewrite deletes the old file) would still
  have their pages and take writes, so the free blocks are trimmed first
  (``fstrim``: the loop device punches them out of the image); the next
  block the AOF needs then fails, within one block's worth of records.  The
  filesystem is told not to preallocate (its ``mb_*`` tunables): blocks it
  reserved ahead of a growing file count as used, are not trimmed, and
  would take hundreds of kilobytes of records before a write reached a
  trimmed block.  (Device-mapper's ``error``/``flakey`` targets would do
  this too, where the kernel has device-mapper.)

:meth:`SmallDisk.heal` removes the filler: the disk has room again.

The namespace is either the caller's own (the fault harness runs in one,
``unshare -n -m``) or held by a sleeping process (:class:`MountNamespace`,
for tests): the mounts, and the loop device (attached with autoclear), go
away with it.  Nothing is mounted anywhere else.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

__all__ = ["MountNamespace", "SmallDisk", "unavailable_reason"]

_BLOCK = 4096


def unavailable_reason() -> str | None:
    """Why small disks cannot be made here (no tools, no privileges), or None."""
    for tool in ("unshare", "nsenter", "mount", "mkfs.ext4", "losetup", "fstrim", "findmnt"):
        if shutil.which(tool) is None:
            return f"{tool!r} not found (util-linux, e2fsprogs)"
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices (/dev/loop-control missing)"
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "--",
                            "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", "/mnt"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return ("cannot mount in a private mount namespace (needs root or "
                f"CAP_SYS_ADMIN): {probe.stderr.strip() or probe.returncode}")
    return None


class MountNamespace:
    """A private mount namespace kept alive by a sleeping process.

    Commands run in it with :meth:`run` (``nsenter``), programs are started
    in it with :meth:`wrap`, and its files are reached from outside through
    :meth:`path` (``/proc/PID/root``).  :meth:`close` ends the holder: the
    namespace and its mounts go with it once the processes started in it
    have exited.
    """

    def __init__(self) -> None:
        self.holder = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "--", "sleep", "infinity"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True)
        own = os.readlink("/proc/self/ns/mnt")
        # unshare has switched namespaces once the holder's link differs.
        deadline = time.monotonic() + 10
        while not self._entered(own):
            if self.holder.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("unshare -m did not start a mount namespace")
            time.sleep(0.01)

    def _entered(self, own: str) -> bool:
        try:
            return os.readlink(f"/proc/{self.holder.pid}/ns/mnt") != own
        except OSError:
            return False

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace (the same process: nsenter execs it)."""
        return ["nsenter", "-t", str(self.holder.pid), "-m", "--", *argv]

    def run(self, *argv: str) -> str:
        done = subprocess.run(self.wrap(list(argv)), capture_output=True, text=True,
                              timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
        return done.stdout

    def path(self, inside: Path | str) -> Path:
        """Where ``inside`` (an absolute path in the namespace) is seen from outside."""
        return Path(f"/proc/{self.holder.pid}/root{Path(inside).resolve()}")

    def close(self) -> None:
        if self.holder.poll() is None:
            self.holder.send_signal(signal.SIGKILL)
        self.holder.wait()
        if self.holder.stderr is not None:
            self.holder.stderr.close()


class SmallDisk:
    """An ext4 filesystem of ``size`` bytes mounted at ``root/data``, inside
    a namespace (``ns``; None: the caller's own, which must be private).

    Its backing file sits on a tmpfs at ``root/backing`` with room for the
    image plus ``spare`` bytes.
    """

    def __init__(self, root: Path, size: int = 32 << 20, spare: int = 64 << 20,
                 ns: MountNamespace | None = None) -> None:
        self.root = root.resolve()
        self.ns = ns
        self.data = self.root / "data"
        self.backing = self.root / "backing"
        self.size = size
        for directory in (self.data, self.backing):
            directory.mkdir(parents=True, exist_ok=True)
        self._run("mount", "-t", "tmpfs", "-o", f"size={size + spare}", "tmpfs",
                  str(self.backing))
        image = self.backing / "disk.img"
        self._run("truncate", "-s", str(size), str(image))
        # No reserved blocks (the node runs as root and would use them), no
        # lazy initialisation (it would write in the background later), and
        # no journal: a journal write the device fails aborts the journal and
        # turns the filesystem read-only for good, where the disk faults
        # want writes to fail and then work again.
        self._run("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", "-E",
                  "lazy_itable_init=0,nodiscard", str(image))
        self._mount()

    def _mount(self) -> None:
        image = self.backing / "disk.img"
        self._run("mount", "-o", "loop,errors=continue", str(image), str(self.data))
        # No preallocation: every block is allocated when written (see the
        # module's docstring).  The tunables live in sysfs, per mount.
        source = self._output("findmnt", "-n", "-o", "SOURCE", str(self.data)).strip()
        tunables = Path("/sys/fs/ext4") / os.path.basename(source)
        (tunables / "mb_stream_req").write_text("1000000000")  # no per-file reservations
        (tunables / "mb_group_prealloc").write_text("1")      # shared ones of one block

    def _output(self, *argv: str) -> str:
        """Run ``argv`` (in the namespace, if any); its standard output."""
        if self.ns is not None:
            return self.ns.run(*argv)
        return subprocess.run(argv, check=True, capture_output=True, text=True,
                              timeout=60).stdout

    def _run(self, *argv: str) -> None:
        self._output(*argv)

    def outside(self, path: Path) -> Path:
        """Where ``path`` on this disk is seen from the caller's namespace."""
        return self.ns.path(path) if self.ns is not None else path

    def free_bytes(self, where: Path | None = None) -> int:
        stat = os.statvfs(self.outside(where or self.data))
        return stat.f_bavail * stat.f_frsize

    def fill(self, leave: int = 0) -> int:
        """Leave about ``leave`` bytes free on the filesystem; bytes taken."""
        return self._fill(self.data / ".filler", leave)

    def break_device(self) -> int:
        """Leave no room under the image: its writeback fails (so does fsync).

        Every free block of the filesystem is trimmed first, so that none
        still has a page under it to write into."""
        self._run("fstrim", str(self.data))
        return self._fill(self.backing / ".filler", 0)

    def _fill(self, filler: Path, leave: int) -> int:
        path = self.outside(filler)
        chunk = b"\0" * (1 << 20)
        size = len(chunk)
        taken = 0
        # Unbuffered: a write the disk refuses fails here, not at close.
        with open(path, "ab", buffering=0) as fh:
            while True:
                want = min(size, self.free_bytes(filler.parent) - leave)
                if want <= 0:
                    break
                try:
                    taken += fh.write(chunk[:want]) or 0
                except OSError:
                    # ext4 refuses a large write early: it reserves room for
                    # the extent blocks of a fragmented file (one block at a
                    # time, without preallocation).  Syncing allocates and
                    # frees those reservations; the rest goes a block at a time.
                    with contextlib.suppress(OSError):
                        os.fsync(fh.fileno())
                    if size == _BLOCK:
                        break   # as full as it gets (or the device refused the rest)
                    size = _BLOCK
            with contextlib.suppress(OSError):
                os.fsync(fh.fileno())
        return taken

    def remount(self) -> None:
        """Unmount and mount the filesystem again: its page cache is gone, as
        after a power loss (whoever uses it must have exited)."""
        self._run("umount", str(self.data))
        self._mount()

    def close(self) -> None:
        """Unmount both (the loop device is released with its mount)."""
        self.heal()
        for mountpoint in (self.data, self.backing):
            try:
                self._run("umount", str(mountpoint))
            except (RuntimeError, subprocess.CalledProcessError):
                self._run("umount", "-l", str(mountpoint))

    def heal(self) -> None:
        """Room again, on the filesystem and under it."""
        for filler in (self.data / ".filler", self.backing / ".filler"):
            try:
                os.unlink(self.outside(filler))
            except FileNotFoundError:
                pass
