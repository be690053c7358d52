"""Signals and the processes `forma` starts: `interrupting_signals` (SIGTERM and SIGHUP end any command as Ctrl-C
does, through its clean-up), the processes `forma dashboard` and `forma demo` start (`CHILDREN`), which end with
`forma` whatever ends it, and `Stopped`, raised once a signal that ended `forma` has been passed on to them."""

import ctypes
import os
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager

STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


class Interrupted(KeyboardInterrupt):
    """A signal that ends `forma`, raised where it is, as Ctrl-C raises KeyboardInterrupt: the same `finally`
    blocks and `except BaseException` clean-ups run (worker processes end, temporary folders go)."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


@contextmanager
def interrupting_signals():
    """While active (in the main thread), the first SIGINT, SIGTERM or SIGHUP raises `Interrupted`; later ones are
    ignored, so that the clean-up the first one started runs to its end (SIGKILL still ends everything). A signal
    this process was started ignoring (`nohup`, a background job of a script) stays ignored. Code that handles
    signals itself (training's step boundary, `Children.forwarding_signals`) sets its own handlers inside and
    puts these back after."""
    if threading.current_thread() is not threading.main_thread():  # handlers can only be set there
        yield
        return
    came: list[int] = []

    def interrupt(signum: int, frame: object) -> None:
        if not came:
            came.append(signum)
            raise Interrupted(signum)

    previous = {
        name: signal.signal(getattr(signal, name), interrupt)
        for name in STOP_SIGNALS
        if signal.getsignal(getattr(signal, name)) is not signal.SIG_IGN
    }
    try:
        yield
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)


class Stopped(BaseException):
    """SIGTERM, SIGINT or SIGHUP ended `forma` while it waited on its children (who were told, and have ended)."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by signal {signum}")
        self.signum = signum


class Children:
    """The processes `forma dashboard` and `forma demo` start, which must end with `forma`, whatever ends it.

    Each child runs in its own process group and asks the kernel (Linux prctl PR_SET_PDEATHSIG) for SIGTERM
    when its parent dies: that covers SIGKILL, which no handler sees. Inside `forwarding_signals()`, SIGTERM,
    SIGINT and SIGHUP are passed on to every child's process group (so Streamlit, and whatever a job started,
    hears them), no new child starts, a group still alive `grace_s` later gets SIGKILL, and once the block is
    done `Stopped` is raised. (A terminal's Ctrl-C reaches only `forma`'s own group; it is forwarded too.)"""

    SIGNALS = STOP_SIGNALS
    PR_SET_PDEATHSIG = 1  # linux/prctl.h

    def __init__(self, grace_s: float = 10.0):
        self.grace_s = grace_s
        self.signum: int | None = None  # the first signal received, once one is
        self._live: list = []
        self._lock = threading.RLock()  # re-entrant: the handler may run inside start(), in the main thread

    def start(self, argv: list[str], **popen: object):
        """Popen(argv) in a new process group, told to die with this process; `Stopped` once a signal came."""
        with self._lock:
            if self.signum is not None:
                raise Stopped(self.signum)
            process = subprocess.Popen(argv, process_group=0, preexec_fn=self._die_with_parent(), **popen)
            self._live = [p for p in self._live if p.poll() is None] + [process]
            if self.signum is not None:  # it came while Popen ran: this child was not yet in the list
                self._signal(process, self.signum)
        return process

    def _die_with_parent(self):
        """What the child runs between fork and exec. The libc look-up is done here, in the parent: a child
        forked from a threaded process must do as little as possible before exec."""
        if not sys.platform.startswith("linux"):
            return None
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        option, signum, parent = self.PR_SET_PDEATHSIG, int(signal.SIGTERM), os.getpid()

        def preexec() -> None:
            prctl(option, signum)
            if os.getppid() != parent:  # the parent died before prctl took effect: no signal will come
                os._exit(1)

        return preexec

    @staticmethod
    def _signal(process, signum: int) -> None:
        try:
            os.killpg(process.pid, signum)
        except (ProcessLookupError, PermissionError):  # the group has ended already
            pass

    def signal_all(self, signum: int) -> None:
        with self._lock:
            live = [p for p in self._live if p.poll() is None]
        for process in live:
            self._signal(process, signum)

    @contextmanager
    def forwarding_signals(self):
        if threading.current_thread() is not threading.main_thread():  # handlers can only be set there
            yield
            return
        with self._lock:
            self.signum = None

        def forward(signum: int, frame: object) -> None:
            first = self.signum is None
            if first:
                self.signum = signum
            self.signal_all(signum)
            if first:
                timer = threading.Timer(self.grace_s, self.signal_all, (signal.SIGKILL,))
                timer.daemon = True
                timer.start()

        previous = {name: signal.signal(getattr(signal, name), forward) for name in self.SIGNALS}
        try:
            yield
        finally:
            for name, handler in previous.items():
                signal.signal(getattr(signal, name), handler)
        if self.signum is not None:
            raise Stopped(self.signum)


CHILDREN = Children()
