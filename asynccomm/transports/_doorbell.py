"""A doorbell for idle ranks that share a host: a sender wakes a sleeping receiver at once.

MPI offers nothing a loop can wait on, so an idle progress task polls on the loop's shared
tick (``_ticker``).  Every tick is a wake-up of the process, and a wake-up costs 20-30 us of
CPU on a small virtual machine: 5-8% of a core at the 0.4 ms a prompt wake needs.  Ranks
on one host can do better.  Each process has a doorbell: one byte of shared memory that
says "asleep, ring me", and a datagram socket its loop waits on.

- A process whose progress tasks are all idle sets its byte, then polls MPI once more, then
  sleeps on its socket (``Ticker``; a slow safety tick stays armed).
- A rank that sends a control message to a process reads that process's byte after the MPI
  send; if it is set, the sender clears it and sends the process one datagram, which wakes
  its loop at once.

Why no wake-up is lost: the receiver stores its byte before it polls, the sender posts its
message before it reads the byte, and a full barrier sits between the two on each side:
the receiver's is a lock round trip (a locked instruction on x86); the sender's is assumed
to be in MPI's send (MPICH's shared-memory queues are built on atomic operations).  So the
receiver's poll finds the message, or the sender finds the byte set.  Where either barrier
is weaker than that, the safety tick bounds how late a missed ring is seen
(``SAFETY_PERIOD`` of ``_ticker``).

The doorbell is the process's, made the first time a world opens (``Doorbell.get``); its
shared byte lives in a file in ``/dev/shm`` that every rank of the host opens while the
world opens, after which its owner unlinks it.  Where any of this is missing (not Linux, no
``/dev/shm``, ranks on other hosts) nothing rings, and the tick polls as before.
"""

from __future__ import annotations

import mmap
import os
import secrets
import socket
import threading
from typing import ClassVar

__all__ = ["SHM_DIR", "Bell", "Doorbell", "fence"]

#: Where the shared bytes live (a tmpfs on Linux).
SHM_DIR = "/dev/shm"
_SIZE = 64  # one cache line: the byte sits alone

_fence_lock = threading.Lock()


def fence() -> None:
    """A full memory barrier (a lock round trip: a locked instruction on x86)."""
    _fence_lock.acquire()
    _fence_lock.release()


def _name(pid: int, token: int) -> str:
    return f"asynccomm-bell-{pid}-{token:x}"


class Bell:
    """A peer process's doorbell, as a sender sees it: ``flag[0]`` is set while it sleeps."""

    __slots__ = ("address", "flag", "sock")

    def __init__(self, flag: mmap.mmap, address: bytes, sock: socket.socket) -> None:
        self.flag = flag
        self.address = address
        self.sock = sock

    def ring(self) -> None:
        """Wake the peer (call once ``flag[0]`` was seen set).  Best effort: a full socket
        buffer means a datagram is waiting there already."""
        self.flag[0] = 0
        try:
            self.sock.sendto(b"\x01", self.address)
        except OSError:
            return
        # The kernel may wake the peer on this core (it shares this process's data): let
        # it run now, not when this process's time slice ends (milliseconds later).
        os.sched_yield()


class Doorbell:
    """This process's doorbell (see module docs): its shared byte, its socket, and the
    bells of the peer processes it has opened."""

    _made: ClassVar[bool] = False
    _instance: ClassVar[Doorbell | None] = None

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.token = secrets.randbits(62) or 1
        name = _name(self.pid, self.token)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK
                                  | socket.SOCK_CLOEXEC)
        self.sock.bind(b"\0" + name.encode())
        self.path: str | None = os.path.join(SHM_DIR, name)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, _SIZE)
            self.flag = mmap.mmap(fd, _SIZE)
        finally:
            os.close(fd)
        self._bells: dict[tuple[int, int], Bell | None] = {}
        self.owner: object | None = None  # the ticker whose loop waits on the socket
        self.rings_heard = 0  # datagrams read: each is a wake-up a sender caused

    @classmethod
    def current(cls) -> Doorbell | None:
        """The process's doorbell if a world has made it (never makes one).  A forked
        child has none: the socket and the byte are its parent's."""
        bell = cls._instance
        return bell if bell is not None and bell.pid == os.getpid() else None

    @classmethod
    def get(cls) -> Doorbell | None:
        """The process's doorbell, made on first use; None where it cannot be made."""
        if not cls._made:
            cls._made = True
            try:
                cls._instance = cls()
            except (OSError, AttributeError, ValueError):
                cls._instance = None
        return cls.current()

    def bell(self, pid: int, token: int) -> Bell | None:
        """The bell of the process ``(pid, token)`` on this host (None if it cannot be
        opened: it rings nothing, and that peer's messages are found by the tick)."""
        key = (pid, token)
        if key not in self._bells:
            name = _name(pid, token)
            try:
                fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_CLOEXEC)
                try:
                    flag = mmap.mmap(fd, _SIZE)
                finally:
                    os.close(fd)
                self._bells[key] = Bell(flag, b"\0" + name.encode(), self.sock)
            except (OSError, ValueError):
                self._bells[key] = None
        return self._bells[key]

    def published(self) -> None:
        """Every peer has opened this process's byte: remove its name (nothing is left
        behind in ``/dev/shm`` when the process ends)."""
        if self.path is not None:
            try:
                os.unlink(self.path)
            except OSError:
                pass
            self.path = None

    def arm(self) -> None:
        """About to sleep: ring me.  The caller polls once more after this."""
        self.flag[0] = 1
        fence()

    def disarm(self) -> None:
        """Awake: nobody needs to ring."""
        self.flag[0] = 0

    def drain(self) -> None:
        """Read the datagrams that woke the loop."""
        recv = self.sock.recv
        try:
            while True:
                recv(64)
                self.rings_heard += 1
        except BlockingIOError:
            pass
