"""The collector makes itself a child subreaper on every run (the login shell's trace), through
_ctypes alone: importing ctypes cost each box ~1.7 ms of CPU a run. What the prctl does must be
what it did: a process the shell's child leaves behind comes back to the collector."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.unit.conftest import packed_program

# Run as a box runs it (isolated, no site): the collector loaded as a module, then as a
# subreaper a grandchild orphaned by its parent; whose child is it then, and was ctypes needed.
PROBE = """
import json, os, sys, time
program = {"__name__": "box_collector"}
path = sys.argv[1]
exec(compile(open(path).read(), path, "exec"), program)
set_on = program["subreaper"](True)
pid = os.fork()
if pid == 0:  # the shell's child: starts a daemon and leaves
    if os.fork() == 0:
        time.sleep(2)
        os._exit(0)
    os._exit(0)
os.waitpid(pid, 0)
deadline = time.monotonic() + 2
adopted = set()
while not adopted and time.monotonic() < deadline:
    adopted = program["children"]()
    time.sleep(0.01)
for orphan in adopted:
    os.kill(orphan, 9)
    os.waitpid(orphan, 0)
set_off = program["subreaper"](False)
print(json.dumps({"on": set_on, "off": set_off, "adopted": len(adopted),
                  "ctypes": "ctypes" in sys.modules}))
"""


def test_the_subreaper_is_set_through_ctypes_own_c_module_and_still_adopts() -> None:
    collector = packed_program("reconciler/observe/remote/collector.py")
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", PROBE, str(collector)],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    said = json.loads(result.stdout)
    assert said == {"on": True, "off": True, "adopted": 1, "ctypes": False}
