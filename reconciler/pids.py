"""Whether a process that left a file behind (a temporary file, a save's build directory named
by its pid) may still be writing it: such leftovers are removed only when it is surely gone."""

from __future__ import annotations

import os


def may_run(pid: int) -> bool:
    """True unless process `pid` is known to be gone (this process is running; another user's
    process, EPERM, or a number out of range is left alone)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):
        return True
    return True
