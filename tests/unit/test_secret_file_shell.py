"""A box_file secret may live in a shell's rc file: the importer points a key only a login shell
exports at `~/.bashrc` (incident #209). Such a file is no dotenv file (compose refuses it as a
whole: `if ...; then`, functions), yet its `export KEY=...` line holds the value. Reading it
as compose reads a `.env` found no key at all: drift said `key-missing` and a converge failed."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from tests.unit.conftest import load_box_program

converge = load_box_program("box_converge_secret_shell", "reconciler/apply/remote/converge.py")

BASHRC = """\
# ~/.bashrc: executed by bash(1) for non-login shells.
case $- in
    *i*) ;;
      *) return;;
esac
if [ -f ~/.bash_aliases ]; then
    . ~/.bash_aliases
fi
lobes() { docker compose "$@"; }
export GATEWAY_API_KEY="gw-from-bashrc-7731"
export HF_TOKEN='hf-from-bashrc-1234'
"""


def _box(path: Path) -> SimpleNamespace:
    secrets = {
        "gateway_api_key": {"path": str(path), "key": "GATEWAY_API_KEY"},
        "hf_token": {"path": str(path), "key": "HF_TOKEN"},
    }
    return SimpleNamespace(p={"box_secrets": secrets})


def test_the_converge_reads_a_key_a_shell_rc_file_exports(tmp_path: Path) -> None:
    rc = tmp_path / ".bashrc"
    rc.write_text(BASHRC)
    values = converge.secret_values(_box(rc))
    assert values == {"gateway_api_key": "gw-from-bashrc-7731", "hf_token": "hf-from-bashrc-1234"}


def test_a_dotenv_secret_file_is_still_read_as_compose_reads_it(tmp_path: Path) -> None:
    """Compose's whole-file rules where compose reads the file: a value across lines."""
    env = tmp_path / ".secrets.env"
    env.write_text('GATEWAY_API_KEY="gw-line-one\ngw-line-two"\nHF_TOKEN=hf-x\n')
    values = converge.secret_values(_box(env))
    assert values == {"gateway_api_key": "gw-line-one\ngw-line-two", "hf_token": "hf-x"}


def test_the_collector_reads_the_same_keys_from_it() -> None:
    """Drift's view of the secret (`secret_sources`): the collector's copy of the reader, held
    byte-identical to the converge's by test_dotenv_compose_parity."""
    collector = load_box_program(
        "box_collector_secret_shell", "reconciler/observe/remote/collector.py"
    )
    values = collector._secret_file_values(BASHRC)
    assert values["GATEWAY_API_KEY"] == "gw-from-bashrc-7731"
    assert values["HF_TOKEN"] == "hf-from-bashrc-1234"
