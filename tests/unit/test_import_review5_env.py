"""`reconcile import`, review 5: odd `.env` keys and values cost their key, never the box.

4. A `.env` key the loader's `env:` keys refuse (`no_proxy`, `http_proxy`, `a-b`: lowercase,
   a dash) was adopted as a pin, and thor's whole adopted state failed to validate; so did a
   GATEWAY_SELF_ORIGIN written with a trailing `/` (`http://10.77.0.11:8000/`), which the
   inventory's gateway_origin refuses. The key is left out with a note; the origin loses its
   single trailing `/` where the loader then accepts it, else it is left out with a note.
5. A `.env` value longer than the writer's line width (4096) was folded by ruamel, and the
   loader read a folded run of two blanks back as one.

Captured data: examples/lab-incidents (thor's lanes carry `.env` through env_file).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from reconciler.desired.load import load_fleet
from reconciler.desired.yaml_source import load_yaml
from reconciler.importer.sourced import Sourced
from reconciler.importer.yaml_out import dump_layer
from tests.unit.test_import_hostile import (
    INCIDENTS,
    Collected,
    edit_box,
    run_import,
    set_env,
)

# 5,200 characters whose blanks come in pairs (a plain scalar: no blank at either end):
# ruamel folds a long plain scalar at a blank, and the loader reads a folded pair as one.
LONG = "tok  en," * 650


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    """A copy of examples/lab-incidents (its snapshot inside), to edit."""
    root = tmp_path / "fleet"
    shutil.copytree(INCIDENTS, root)
    return root


def pinned(values: dict[str, str]) -> object:
    """`.env` lines of `values`, carried by thor's lanes through env_file (an `env:` pin)."""

    def edit(collected: Collected) -> None:
        for key, value in values.items():
            set_env(collected, key, value, line=1300 + len(collected["envfile"]))
            for c in collected["docker"]["containers"]:
                if c["service"] != "gateway":  # the lanes: env_file
                    c["env"][key] = value

    return edit


def origin(value: str) -> object:
    def edit(collected: Collected) -> None:
        set_env(collected, "GATEWAY_SELF_ORIGIN", value, line=1199)

    return edit


def inventory_entry(out: Path, box: str) -> dict[str, object]:
    return dict(YAML().load((out / "inventory/lab.yaml").read_text(encoding="utf-8"))["boxes"][box])


# -- 4. keys the loader refuses ------------------------------------------------------------------
def test_a_key_the_loader_refuses_is_left_out_not_the_box(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    odd = {"no_proxy": "localhost,10.77.0.1", "http_proxy": "http://proxy.corp:3128", "a-b": "v"}
    edit_box(fleet / "snapshot", "thor", pinned(odd))
    out = tmp_path / "adopted"
    code, text = run_import(capsys, fleet, "--output", str(out))
    assert code == 2, text
    adopted = load_fleet(out, "lab")
    assert sorted(adopted.boxes) == ["orin", "spark", "thor"]
    env = adopted.boxes["thor"].env
    assert not set(odd) & set(env)
    assert "INNEREYE_DECLARED_PEAK_GIB" in env  # the box's other pins stay adopted
    for key in odd:
        assert f"thor: {key} is left out of the adopted state: an env: key" in text


# -- 4. an origin with a trailing slash ----------------------------------------------------------
def test_the_default_origin_with_a_trailing_slash_validates(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit_box(fleet / "snapshot", "thor", origin("http://10.77.0.11:8000/"))
    out = tmp_path / "adopted"
    code, text = run_import(capsys, fleet, "--output", str(out))
    assert code == 2, text
    assert sorted(load_fleet(out, "lab").boxes) == ["orin", "spark", "thor"]
    assert "gateway_origin" not in inventory_entry(out, "thor")  # the inventory's default
    assert "thor: GATEWAY_SELF_ORIGIN (.env:1199) ends in /" in text


def test_another_origin_with_a_trailing_slash_is_adopted_without_it(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit_box(fleet / "snapshot", "thor", origin("http://thor.lab:8000/"))
    out = tmp_path / "adopted"
    code, text = run_import(capsys, fleet, "--output", str(out))
    assert code == 2, text
    assert load_fleet(out, "lab").inventory.boxes["thor"].gateway_origin == "http://thor.lab:8000"
    assert inventory_entry(out, "thor")["gateway_origin"] == "http://thor.lab:8000"


@pytest.mark.parametrize(
    "value", ["http://10.77.0.11:8000//", "http://10.77.0.11:8000/lobes", "thor.lab:8000"]
)
def test_an_origin_the_loader_refuses_is_left_out_with_a_note(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    edit_box(fleet / "snapshot", "thor", origin(value))
    out = tmp_path / "adopted"
    code, text = run_import(capsys, fleet, "--output", str(out))
    assert code == 2, text
    assert load_fleet(out, "lab").inventory.boxes["thor"].gateway_origin is None
    assert "thor: GATEWAY_SELF_ORIGIN (.env:1199) is no origin the inventory accepts" in text


def test_an_origin_carrying_a_password_is_never_written(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit_box(fleet / "snapshot", "thor", origin("http://gw:hunter2@thor.lab:8000"))
    out = tmp_path / "adopted"
    code, text = run_import(capsys, fleet, "--output", str(out))
    assert code == 2, text
    assert load_fleet(out, "lab").inventory.boxes["thor"].gateway_origin is None
    assert not [p for p in out.rglob("*.yaml") if "hunter2" in p.read_text(encoding="utf-8")]
    assert "hunter2" not in text


# -- 5. a long value -----------------------------------------------------------------------------
def test_a_long_value_round_trips_through_the_writer_and_the_loader(tmp_path: Path) -> None:
    assert len(LONG) > 5000
    path = tmp_path / "all.yaml"
    path.write_text(dump_layer({"env": {"K": Sourced(LONG, ".env:1300")}}, "h"), encoding="utf-8")
    assert load_yaml(path, "all.yaml", within=tmp_path).data["env"]["K"] == LONG


def test_a_long_env_pin_is_adopted_exactly(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit_box(fleet / "snapshot", "thor", pinned({"VLLM_GDN_DECODE_KERNEL": LONG}))
    out = tmp_path / "adopted"
    code, text = run_import(capsys, fleet, "--output", str(out))
    assert code == 2, text
    assert load_fleet(out, "lab").boxes["thor"].env["VLLM_GDN_DECODE_KERNEL"] == LONG
