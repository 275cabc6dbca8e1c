"""A pyinfra connector that runs commands through OpenSSH, sharing one connection per box.

pyinfra's default connector is paramiko: a new authenticated session per run, slow to set up.
This connector uses the same OpenSSH transport as `reconcile drift` (ControlMaster reuse,
BatchMode, the inventory's key and known_hosts), so a drift report followed by a converge
reuses one connection, and nothing differs between what `reconcile` observes and what
`pyinfra` changes. Hosts select it as `@openssh/<box>` (inventory.py does this).
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.output import echo
from pyinfra.api.util import get_file_io
from pyinfra.connectors.base import BaseConnector, DataMeta
from pyinfra.connectors.util import (
    CommandOutput,
    execute_command_with_sudo_retry,
    make_unix_command_for_host,
)
from typing_extensions import Unpack

from reconciler.observe.bounded_process import run_bounded
from reconciler.observe.transport import SILENT_255, Target, UnsafeTarget, ssh_argv
from reconciler.scrub import exception_text, scrub_text

if TYPE_CHECKING:
    from pyinfra.api.arguments import ConnectorArguments

# What connect() gives a box to open (or reuse) its connection and run `true`.
CONNECT_S = 20.0


class OpenSSHConnector(BaseConnector):
    handles_execution = True
    # pyinfra declares data_meta as a plain class attribute; ClassVar would clash with it.
    data_meta = {  # noqa: RUF012
        "ssh_hostname": DataMeta("SSH hostname"),
        "ssh_port": DataMeta("SSH port", 22),
        "ssh_user": DataMeta("SSH user"),
        "ssh_key": DataMeta("SSH private key file"),
        "ssh_known_hosts_file": DataMeta("known_hosts file (strict checking)"),
    }

    @staticmethod
    def make_names_data(name: str | None = None) -> Iterator[tuple[str, dict[str, Any], list[str]]]:
        if not name:
            raise ValueError("use @openssh/<box>")
        yield name, {}, []

    def _target(self) -> Target:
        data = self.host.data
        return Target(
            box=self.host.name,
            hostname=str(data.get("ssh_hostname") or self.host.name),
            user=str(data.get("ssh_user") or "root"),
            port=int(data.get("ssh_port") or 22),
            key_file=data.get("ssh_key"),
            known_hosts=data.get("ssh_known_hosts_file"),
        )

    def connect(self) -> None:
        from pyinfra.api.exceptions import ConnectError

        # Open (or reuse) the master connection now, so an unreachable box fails here.
        try:
            argv = ssh_argv(self._target(), "true")
        except UnsafeTarget as exc:  # a user or host that ssh would read as an option
            raise ConnectError(str(exc)) from None
        # A box that hangs (sshd silent after accepting, a stalled key exchange) or ssh that
        # cannot start is this host's failure to connect: pyinfra goes on with the others.
        # Raised as anything else, it was pyinfra's "internal exception", ending every host.
        try:
            code, output = run_bounded(argv, timeout=CONNECT_S)
        except TimeoutError:
            raise ConnectError(f"no answer within {CONNECT_S:g} s") from None
        except OSError as exc:
            raise ConnectError(f"cannot run ssh: {exception_text(exc)}") from None
        if code != 0:
            silent = SILENT_255 if code == 255 else f"ssh exited {code}"
            raise ConnectError(_last_line(output, silent))

    def run_shell_command(
        self,
        command: StringCommand,
        print_output: bool = False,
        print_input: bool = False,
        **arguments: Unpack[ConnectorArguments],
    ) -> tuple[bool, CommandOutput]:
        arguments.pop("_get_pty", False)
        timeout = arguments.pop("_timeout", None)
        stdin = arguments.pop("_stdin", None)
        carried = getattr(command, "stdin", None)  # transport.WithStdin: the Collected fact's
        if carried is not None:  # payload, sent on ssh's stdin, never in its command line
            stdin = carried
        success_codes = arguments.pop("_success_exit_codes", None)

        def execute() -> tuple[int, CommandOutput]:
            unix = make_unix_command_for_host(self.state, self.host, command, **arguments)
            return run_bounded(
                ssh_argv(self._target(), unix.get_raw_value()),
                stdin=stdin,
                timeout=timeout,
                print_output=print_output,
                print_prefix=self.host.print_prefix,
            )

        code, output = execute_command_with_sudo_retry(self.host, arguments, execute)
        ok = code in success_codes if success_codes else code == 0
        return ok, output

    def put_file(
        self,
        filename_or_io: Any,
        remote_filename: str,
        remote_temp_filename: str | None = None,
        print_output: bool = False,
        print_input: bool = False,
        **arguments: Any,
    ) -> bool:
        """The file's bytes, exactly, written to `remote_filename` by `cat >` on ssh's stdin:
        no scp/sftp subsystem needed on the box. The bytes go as they are (run_bounded sends
        bytes unchanged; text would go through pyinfra's write_stdin, which adds a newline and
        needs UTF-8): a `files.put` whose bytes differ never matches its checksum and uploads
        again on every run. `cat` runs as the sudo/su user itself (make_unix_command_for_host
        wraps it, stdin passes through), so pyinfra's ssh detour through a temporary file, for
        SFTP that can only write as the login user, is not needed (`remote_temp_filename`
        unused); like that detour's `cp`, writing in place keeps an existing file's owner and
        mode. A failure raises OSError, as pyinfra's docker connector does; pyinfra logs it
        and fails the operation."""
        with get_file_io(filename_or_io) as file_io:
            data = file_io.read()
        if isinstance(data, str):  # a text-mode file object: its UTF-8, as paramiko's putfo
            data = data.encode()
        ok, output = self.run_shell_command(
            StringCommand("cat", ">", QuoteString(remote_filename)),
            print_output=print_output,
            print_input=print_input,
            **{**arguments, "_stdin": data},
        )
        if not ok:
            raise OSError(_last_line(output, "the upload failed"))
        if print_output:
            echo(f"{self.host.print_prefix}file uploaded: {remote_filename}", err=True)
        return True

    def get_file(
        self,
        remote_filename: str,
        filename_or_io: Any,
        remote_temp_filename: str | None = None,
        print_output: bool = False,
        print_input: bool = False,
        **arguments: Any,
    ) -> bool:
        """`remote_filename`'s bytes, exactly, into `filename_or_io`. The box sends them as
        base64 (coreutils): run_bounded hands back stdout as decoded lines, which cannot give
        back bytes that are not UTF-8 nor say whether the file ended in a newline; base64 text
        survives that whole, and stays within its output bound (a file up to ~6 MiB). Run as
        the sudo/su user itself, like put_file. Its lines are not printed (`print_output`
        would show the encoded file); a failure raises OSError."""
        ok, output = self.run_shell_command(
            # `<`: the shell opens the file, so a name starting with `-` is never an option.
            StringCommand("base64", "<", QuoteString(remote_filename)),
            print_output=False,
            print_input=print_input,
            **arguments,
        )
        if not ok:
            raise OSError(_last_line(output, "the download failed"))
        try:
            data = base64.b64decode("".join(output.stdout_lines), validate=True)
        except binascii.Error:  # something else on stdout (a login script's words)
            raise OSError(f"{remote_filename}: the box's answer is not base64") from None
        with get_file_io(filename_or_io, "wb") as file_io:
            file_io.write(data.decode() if isinstance(file_io, io.TextIOBase) else data)
        if print_output:
            echo(f"{self.host.print_prefix}file downloaded: {remote_filename}", err=True)
        return True


def _last_line(output: CommandOutput, otherwise: str) -> str:
    """What a failure says: the last line ssh or the box wrote on stderr, scrubbed (it may
    quote anything, a secret included, and pyinfra shows it), as transport.py says it."""
    lines = [line for line in output.stderr_lines if line.strip()]
    return scrub_text(lines[-1]) if lines else otherwise
