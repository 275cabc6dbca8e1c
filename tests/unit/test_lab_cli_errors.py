"""`python -m lab`: a step that times out or an image build that fails is said in one line,
exit 1, never a traceback (lab/cli.py)."""

from __future__ import annotations

import subprocess

import pytest

from lab import cli, statustable
from lab.images.dockercli import DockerError


@pytest.mark.parametrize(
    ("raised", "said"),
    [
        (
            subprocess.TimeoutExpired(["docker", "compose", "up", "-d"], 600),
            "lab: docker compose up -d: no answer in 600s",
        ),
        (subprocess.TimeoutExpired("sshd -t", 1.5), "lab: sshd -t: no answer in 1.5s"),
        (DockerError("build of lab/vllm-standin failed"), "lab: DockerError: build of"),
    ],
)
def test_a_failed_step_is_one_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    raised: Exception,
    said: str,
) -> None:
    def fail() -> None:
        raise raised

    monkeypatch.setattr(statustable, "status", fail)
    assert cli.main(["status"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(said) and "Traceback" not in err
