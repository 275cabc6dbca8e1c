"""The `@openssh` connector's commands are read within bounds (observe/bounded_process.py).

pyinfra's own run_local_process kept every line a box wrote (a fact answered with 400 MiB was
held whole) and decoded strictly (one byte that is not UTF-8: a traceback), and the connector
raised ssh's whole stderr, unscrubbed, as its error. Real local processes play the box here.
"""

from __future__ import annotations

import sys
import tracemalloc
from types import SimpleNamespace

import pytest

from reconciler.observe import openssh_connector
from reconciler.observe.bounded_process import TOO_MUCH, run_bounded
from reconciler.observe.transport import OUTPUT_LIMIT_BYTES, STDERR_LIMIT_BYTES

SECRET = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_output_within_the_bound_is_pyinfras_command_output() -> None:
    code, output = run_bounded(
        python("import sys; print('one'); print('two'); print('oops', file=sys.stderr)")
    )
    assert code == 0
    assert output.stdout_lines == ["one", "two"] and output.stderr_lines == ["oops"]


def test_stdin_reaches_the_command_as_pyinfra_sends_it() -> None:
    code, output = run_bounded(python("import sys; sys.stdout.write(sys.stdin.read())"), "a\nb")
    assert (code, output.stdout_lines) == (0, ["a", "b"])


def test_output_past_the_bound_is_refused_and_never_held() -> None:
    """A box answering with three times the bound: stopped, and the command fails saying so."""
    many = 3 * OUTPUT_LIMIT_BYTES // (1024 * 1024)
    flood = f"import sys\nfor _ in range({many}):\n    sys.stdout.write('x' * 1048575 + '\\n')\n"
    tracemalloc.start()
    try:
        code, output = run_bounded(python(flood))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == TOO_MUCH
    assert output.stderr_lines[-1].startswith(f"more than {OUTPUT_LIMIT_BYTES} bytes of output")
    assert sum(len(line) + 1 for line in output.stdout_lines) <= OUTPUT_LIMIT_BYTES
    assert peak < 2 * OUTPUT_LIMIT_BYTES + 4 * 1024 * 1024  # not the 24 MiB it wrote


def test_stderr_past_its_bound_is_read_on_and_dropped() -> None:
    loud = (
        "import sys\nfor _ in range(64):\n    sys.stderr.write('e' * 16383 + '\\n')\nprint('done')"
    )
    code, output = run_bounded(python(loud))
    assert (code, output.stdout_lines) == (0, ["done"])  # never blocked on a full pipe
    assert sum(len(line) + 1 for line in output.stderr_lines) <= STDERR_LIMIT_BYTES


def test_bytes_that_are_not_utf8_are_replaced_not_raised() -> None:
    code, output = run_bounded(python("import sys; sys.stdout.buffer.write(b'caf\\xe9\\n')"))
    assert (code, output.stdout_lines) == (0, ["caf\ufffd"])


def test_a_command_past_its_timeout_raises_as_pyinfra_does() -> None:
    with pytest.raises(TimeoutError):
        run_bounded(python("import time; time.sleep(30)"), timeout=0.5)


def connector_whose_ssh_runs(monkeypatch: pytest.MonkeyPatch, code: str) -> object:
    monkeypatch.setattr(openssh_connector, "ssh_argv", lambda target, command: python(code))
    connector = openssh_connector.OpenSSHConnector.__new__(openssh_connector.OpenSSHConnector)
    connector.host = SimpleNamespace(name="thor", data={"ssh_user": "lobes", "ssh_port": 22})  # type: ignore[assignment]
    return connector


def test_a_failed_connection_says_its_last_line_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyinfra.api.exceptions import ConnectError

    said = (
        "import sys\n"
        "sys.stderr.write('debug1: reading config\\n')\n"
        f"sys.stderr.write('denied: HF_TOKEN={SECRET}\\x1b[2J\\n')\n"
        "sys.exit(255)\n"
    )
    connector = connector_whose_ssh_runs(monkeypatch, said)
    with pytest.raises(ConnectError) as caught:
        connector.connect()  # type: ignore[attr-defined]
    message = str(caught.value)
    assert message.startswith("denied: HF_TOKEN=***")
    assert SECRET not in message and "\x1b" not in message and "debug1" not in message
