"""`reconcile import`, review 5: secrets an import must not write, or must not point at.

1. A password inside a URL in `.env` (`HTTPS_PROXY=http://svc-lobes:hunter2@proxy.corp:3128`),
   carried by the lanes through env_file, was adopted in clear as an `env:` pin. Such a value
   carries a secret (boxview.carries_secret): the key is left out with its note, as a value
   the box hashed inline (`http://user:{"secret": "hmac:..."}@host`) is.
3. A secret only the login shell exports became a reference to the whole rc file
   (`{source: box_file, path: ~/.bashrc, key: GATEWAY_API_KEY}`), but a converge reads the
   file's last assignment of the key while bash may have run another one (an if/else). The
   observation holds only the line bash ran (`~/.bashrc:6`), never whether the file assigns
   the key elsewhere: the reference is the placeholder, and the note names the line.

Captured data: examples/lab-incidents (thor's gateway key is exported at ~/.bashrc:6,
incident #209), edited as an operator's boxes would be.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from reconciler.desired.load import load_fleet
from reconciler.importer.boxview import carries_secret
from tests.unit.test_import_hostile import (
    INCIDENTS,
    Collected,
    edit_box,
    layer,
    run_import,
    set_env,
)

PROXY = "http://svc-lobes:hunter2@proxy.corp:3128"
MIRROR = "https://deploy:s3cr3tpw@hf-mirror.corp"
# The form the box's collector hashes such a password in (the run's keyed digest, inline).
HASHED = 'http://svc-lobes:{"secret": "hmac:' + "a" * 64 + '"}@proxy.corp:3128'


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    """A copy of examples/lab-incidents (its snapshot inside), to edit."""
    root = tmp_path / "fleet"
    shutil.copytree(INCIDENTS, root)
    return root


def pinned(values: dict[str, str]) -> object:
    """`.env` lines of `values`, carried by thor's lanes through env_file (as
    INNEREYE_DECLARED_PEAK_GIB is): what makes a key an `env:` pin."""

    def edit(collected: Collected) -> None:
        for key, value in values.items():
            set_env(collected, key, value, line=1300 + len(collected["envfile"]))
            for c in collected["docker"]["containers"]:
                if c["service"] != "gateway":  # the lanes: env_file
                    c["env"][key] = value

    return edit


def written(out: Path) -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(out.rglob("*.yaml")))


# -- 1. a URL's password -------------------------------------------------------------------------
@pytest.mark.parametrize("value", [PROXY, MIRROR, HASHED, "http://u:p@h"])
def test_a_url_with_a_password_carries_a_secret(value: str) -> None:
    assert carries_secret(value)


@pytest.mark.parametrize(
    "value", ["http://proxy.corp:3128", "http://svc-lobes@proxy.corp:3128", "http://h:80/a@b"]
)
def test_a_url_without_a_password_carries_none(value: str) -> None:
    assert not carries_secret(value)  # a user name alone, a port, an `@` in the path


def test_a_password_in_a_url_is_never_written(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit_box(
        fleet / "snapshot",
        "thor",
        pinned({"HTTPS_PROXY": PROXY, "HF_ENDPOINT": MIRROR, "ALL_PROXY": HASHED}),
    )
    out = tmp_path / "adopted"
    code, text = run_import(capsys, fleet, "--output", str(out))
    assert code == 2, text
    files = written(out)
    for secret in ("hunter2", "s3cr3tpw", "hmac:"):
        assert secret not in files and secret not in text
    env = load_fleet(out, "lab").boxes["thor"].env
    assert not {"HTTPS_PROXY", "HF_ENDPOINT", "ALL_PROXY"} & set(env)
    # Left out by key, with the note every value carrying a secret gets.
    for key in ("HTTPS_PROXY", "HF_ENDPOINT", "ALL_PROXY"):
        assert f"thor: {key} carries a secret inside its value (***): not adopted" in text
    assert "INNEREYE_DECLARED_PEAK_GIB" in env  # the box's other pins are adopted as before


# -- 3. a key only the login shell exports -------------------------------------------------------
def test_a_login_shell_export_becomes_a_placeholder_naming_its_line(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "adopted"
    code, text = run_import(capsys, fleet, "--output", str(out))
    assert code == 2, text
    source = load_fleet(out, "lab").boxes["thor"].secrets["gateway_api_key"]
    # Never the rc file: a converge would read its last assignment of the key, which the
    # trace cannot show is the one bash ran.
    assert (source.source, source.path, source.key) == (
        "box_file",
        "~/.lobes/.secrets.unfound.env",
        "GATEWAY_API_KEY",
    )
    comment = str(layer(out, "thor")["secrets"].ca.items["gateway_api_key"])
    assert "placeholder" in comment and "~/.bashrc:6" in comment
    found = text.split("found while importing:", 1)[1]
    assert "thor: the GATEWAY_API_KEY in use (" in found
    assert "is exported by the login shell at ~/.bashrc:6" in found
    assert "secrets.gateway_api_key points at ~/.lobes/.secrets.unfound.env" in found
    summary = next(line for line in text.splitlines() if line.strip().startswith("thor:"))
    assert summary.endswith("; not adopted, a placeholder: secrets.gateway_api_key")
    assert "hmac:" not in text


def test_a_secret_file_the_collector_read_is_still_pointed_at(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The secret sources were read on the box as a converge reads them: a digest match
    there is a reference, as before (spark's and orin's keys in ~/.lobes/.secrets.env)."""
    out = tmp_path / "adopted"
    code, text = run_import(capsys, fleet, "--output", str(out))
    assert code == 2, text
    mesh = load_fleet(out, "lab").boxes["spark"].secrets["mesh_key"]
    assert (mesh.path, mesh.key) == ("~/.lobes/.secrets.env", "LOBES_MESH_KEY")
