"""The watchdog between moetune and a serving engine it starts (engine_server.py).

Run as `python -m moetune.search.study.engine_guard PARENT_PID GRACE_S -- CMD...`, as the leader of
its own process group (the caller starts it with start_new_session). It runs CMD in that group and
ends the whole group — the engine and every process the engine forked — when:

- moetune dies, even by SIGKILL: the kernel's parent-death signal (prctl PR_SET_PDEATHSIG) wakes it,
  and it also notices its parent's pid change (reparented) on its own poll;
- moetune asks (SIGTERM to the group): the engine gets SIGTERM too, and SIGKILL after GRACE_S;
- CMD exits on its own (the engine crashed or refused a flag): whatever it left behind is ended.

It exits with CMD's return code (or 128 + signal). Only the standard library, no moetune imports:
it starts quickly and cannot fail on moetune's own state.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

POLL_S = 0.1


def group_members(pgid: int, exclude: int | None = None) -> list[int]:
    """Live (not zombie) processes whose process group is `pgid`, read from /proc."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == exclude:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(name))
    return out


def set_parent_death_signal(sig: int) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies (Linux; a no-op elsewhere)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def end_group(pgid: int, grace_s: float) -> None:
    """SIGTERM every other process of the group, then SIGKILL whatever is left after `grace_s`."""
    me = os.getpid()
    for pid in group_members(pgid, exclude=me):
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while group_members(pgid, exclude=me) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    for pid in group_members(pgid, exclude=me):
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while group_members(pgid, exclude=me) and time.monotonic() < deadline:
        time.sleep(POLL_S)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: engine_guard PARENT_PID GRACE_S -- CMD...", file=sys.stderr)
        return 2
    parent, grace_s, cmd = int(argv[0]), float(argv[1]), argv[3:]
    stop = {"asked": False}

    def asked(_sig, _frame):
        stop["asked"] = True

    signal.signal(signal.SIGTERM, asked)  # a Python handler (not SIG_IGN): CMD gets the default back on exec
    signal.signal(signal.SIGINT, asked)
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent:  # moetune died before the parent-death signal was set
        return 1
    pgid = os.getpgid(0)
    child = subprocess.Popen(cmd)  # same process group as this guard
    while True:
        rc = child.poll()
        if rc is not None or stop["asked"] or os.getppid() != parent:
            break
        time.sleep(POLL_S)
    end_group(pgid, grace_s)
    rc = child.wait()
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
