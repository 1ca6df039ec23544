"""This process's children, for the tests' leak checks (conftest.py and the engine modules' own)."""

from __future__ import annotations

import os


def live_children() -> dict[int, str]:
    """Direct children of this process that are not zombies (zombies are reaped on the way)."""
    me, out = os.getpid(), {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        state, ppid = stat.rpartition(")")[2].split()[:2]
        if int(ppid) != me:
            continue
        pid = int(entry)
        if state == "Z":
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                out[pid] = f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
        except OSError:
            out[pid] = "?"
    return out
