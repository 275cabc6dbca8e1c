"""Review 5 of the collector: compose's error text quoted a `.env` or `env_file` value in clear.

compose refuses a `.env` with an unterminated quote (`EXTRA_DB_PASSWORD="Hunter2-lab-secret`):
the render was skipped for it, but `docker compose config --variables` still ran and its
stderr (`line 2: unterminated quoted value "Hunter2-lab-secret`) went into the answer; the
render's own error did the same for an `env_file:` compose refuses, and compose also quotes
`variable name "MY$TOKEN=hf_..."` and `Invalid template: "${...`. The texts below are the real
`docker compose` v2.40.3's, and the deployments are rendered by the real compose.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.conftest import load_box_program

collector = load_box_program(
    "box_collector_review5_errors", "reconciler/observe/remote/collector.py"
)
HIDDEN = "(text quoted by compose not shown)"

# stderr of `docker compose config` (v2.40.3), each with what must go and what must stay.
CAPTURED = [
    (
        'failed to read /d/.env: line 2: unterminated quoted value "Hunter2-lab-secret\n',
        "Hunter2",
        "failed to read /d/.env: line 2: unterminated quoted value " + HIDDEN,
    ),
    (
        "failed to read /d/.secrets.env: line 2: unterminated quoted value"
        " 'correct horse battery staple\n",
        "horse",
        "failed to read /d/.secrets.env: line 2: unterminated quoted value " + HIDDEN,
    ),
    (
        'failed to read /d/.secrets.env: line 1: unexpected character "$" in variable name'
        ' "MY$TOKEN=hf_abcdefgh123"\n',
        "hf_abc",
        "failed to read /d/.secrets.env: line 1: unexpected character " + HIDDEN,
    ),
    (
        'failed to read /d/.env: Invalid template: "${Hunter2 secret"\n',
        "Hunter2",
        "failed to read /d/.env: Invalid template " + HIDDEN,
    ),
    (  # the template follows, unquoted, possibly over several lines
        "invalid interpolation format for services.g.environment.K.\n"
        "You may need to escape any $ with another $.\n${K:-abc-secret x\n",
        "abc-secret",
        "invalid interpolation format for services.g.environment.K. " + HIDDEN,
    ),
    (  # a line that starts with a quote: the line before says what failed
        "decoding failed due to the following error(s):\n\n"
        "'services[g].mem_limit' invalid size: 'sk-secret-value'\n",
        "sk-secret",
        "decoding failed due to the following error(s) " + HIDDEN,
    ),
]


@pytest.mark.parametrize(
    ("stderr", "secret", "shown"),
    CAPTURED,
    ids=["unterminated", "env_file", "variable-name", "template", "interpolation", "decoding"],
)
def test_what_compose_quotes_is_cut_and_the_rest_says_what_is_wrong(
    stderr: str, secret: str, shown: str
) -> None:
    said = collector.compose_error(stderr)
    assert secret not in said
    assert said == shown


@pytest.mark.parametrize(
    "stderr",
    [
        "env file /d/missing.env not found: stat /d/missing.env: no such file or directory\n",
        'time="2026-12-06T10:58:51Z" level=warning msg="The \\"K\\" variable is not set."\n'
        "yaml: line 5: found unexpected end of stream\n",
    ],
)
def test_a_line_without_quotes_is_shown_whole(stderr: str) -> None:
    assert collector.compose_error(stderr) == stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "line",
    [
        'service "gateway" depends on undefined service "vllm": invalid compose project',
        "services.g additional properties 'imagee' not allowed",
        "services.g.deploy.resources.reservations.devices.0 missing property 'capabilities'",
        'yaml: unmarshal errors: mapping key "image" already defined at line 5',
        'service "g" refers to undefined network mesh: invalid compose project',
    ],
)
def test_the_names_compose_quotes_stay_they_say_what_to_fix(line: str) -> None:
    """The operator's own service, network and property names, quoted by compose: cut at the
    first quote they read `service (text quoted by compose not shown)`."""
    assert collector.compose_error(line + "\n") == line


@pytest.mark.parametrize(
    "line",
    [
        'service "x y" has a value "sk-abc-123"',  # no plain name: cut
        'secret "HF_TOKEN=hf_abc123" not found',
        'service "gateway" environment value "sk-abc-123" is invalid',  # a value, not a name
    ],
)
def test_anything_else_quoted_is_still_cut(line: str) -> None:
    said = collector.compose_error(line + "\n")
    assert "sk-abc" not in said and "hf_abc" not in said and said.endswith(HIDDEN)


# -- through the real compose ---------------------------------------------------------------------
COMPOSE = "services:\n  gateway:\n    image: busybox\n    environment:\n      K: ${K:-x}\n"


def _collect(home: Path, monkeypatch: pytest.MonkeyPatch, compose: str = COMPOSE) -> str:
    """The answer of a collect of ~/lobes under `home`, as the box prints it."""
    monkeypatch.setenv("HOME", str(home))
    (home / "lobes" / "compose.yml").write_text(compose)
    payload: dict[str, Any] = {
        "run_key": "k" * 32, "directory": "~/lobes", "project": "lobes",
        "compose_files": ["compose.yml"], "managed_env": {}, "box_secrets": {},
        "controller_secrets": {}, "secret_patterns": [], "gateway_port": 1, "timeout_s": 20,
        "probe_timeout_s": 1,
    }  # fmt: skip
    return str(collector.without_known_secrets(collector.collect(payload, {})))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "lobes").mkdir()
    (tmp_path / ".bash_profile").write_text("")
    return tmp_path


def test_an_env_compose_refuses_is_not_given_to_compose_variables(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (home / "lobes" / ".env").write_text('A=1\nEXTRA_DB_PASSWORD="Hunter2-lab-secret\n')
    out = _collect(home, monkeypatch)
    assert "Hunter2" not in out
    doc = json.loads(out)
    assert doc["variables"]["error"].startswith("not read: file .env: docker compose refuses")
    assert doc["render"]["error"].startswith("not rendered: file .env")


@pytest.mark.parametrize(
    ("text", "secret", "wrong"),
    [
        # compose counts the line after an unterminated value's: its line 2 is this line 1
        ("X='correct horse battery staple\n", "horse", "line 2: unterminated quoted value"),
        ("MY$TOKEN=hf_abcdefgh123456\n", "hf_abc", "line 1: unexpected character"),
    ],
    ids=["unterminated", "variable-name"],
)
def test_an_env_file_compose_refuses_is_named_without_its_text(
    home: Path, monkeypatch: pytest.MonkeyPatch, text: str, secret: str, wrong: str
) -> None:
    (home / "lobes" / ".secrets.env").write_text(text)
    compose = "services:\n  gateway:\n    image: busybox\n    env_file: [.secrets.env]\n"
    out = _collect(home, monkeypatch, compose)
    assert secret not in out
    error = json.loads(out)["render"]["error"]
    assert ".secrets.env: " + wrong in error and error.endswith(HIDDEN)
