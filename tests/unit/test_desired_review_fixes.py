"""The desired-state loader's review fixes, one section per finding.

Most refusals are rows of the curated table (bad_inputs_table.py, from `env_value_line_separator`
on), checked there at their exact FILE:LINE:COL; this file runs those rows by name, so each
finding has a test of its own, and holds what a table row cannot: the box programs' rules
against the loader's, the caches, the two YAML readers, and values that must never be shown.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from reconciler.desired import fingerprint, models, types, yaml_fast, yaml_scalars
from reconciler.desired.cache import cached_fleet, load_fleet_cached
from reconciler.desired.envfile import env_text
from reconciler.desired.load import load_fleet
from reconciler.desired.models import EnvValue, GatewaySpec, MemoryPolicy
from reconciler.desired.problems import DesiredStateError
from reconciler.desired.yaml_source import MAX_DEPTH, MAX_NODES, parse_text
from reconciler.drift_inputs import cached_inputs, remembered_inputs
from tests.unit.conftest import load_box_program
from tests.unit.converge_helpers import base_payload

from .bad_inputs_table import BAD_INPUTS
from .test_desired_bad_inputs import FIXTURE, _fleet_with

converge = load_box_program("review_converge", "reconciler/apply/remote/converge.py")
ROWS = {case[0]: case[1:] for case in BAD_INPUTS}


def _refusals(tmp_path: Path, row: str) -> list[str]:
    """The problems the loader reports for one row of the table (which checks them exactly)."""
    file, old, new, expected = ROWS[row]
    root = _fleet_with(tmp_path, file, old, new)
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(root)
    found = [str(p) for p in caught.value.problems]
    assert found == expected
    return found


def _fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The small valid fleet, with a cache directory of its own."""
    root = tmp_path / "fleet"
    shutil.copytree(FIXTURE, root)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return root


def _inventory(root: Path) -> Path:
    return root / "inventory" / "hosts.yaml"


def _add_to_inventory(root: Path, lines: str) -> None:
    inv = _inventory(root)
    inv.write_text(lines + inv.read_text(encoding="utf-8"), encoding="utf-8")


def _ok(kind: Any, value: Any) -> bool:
    try:
        TypeAdapter(kind).validate_python(value, strict=True)
    except ValidationError:
        return False
    return True


def _box_ok(check: Any, *args: Any) -> bool:
    try:
        check(*args)
    except converge.Failed:
        return False
    return True


BOX_MAX_S = converge.MAX_TIMEOUT_S


# -- 1. what str.splitlines() breaks at never reaches `.env`; the box splits at LF only ---------
SPLITLINES_BREAKS = [chr(c) for c in range(0x3000) if len(f"a{chr(c)}b".splitlines()) > 1]


def test_every_break_splitlines_knows_besides_lf_is_refused_in_an_env_value() -> None:
    assert [*"\n\x0b\x0c\r\x1c\x1d\x1e\x85\u2028\u2029"] == SPLITLINES_BREAKS
    for char in SPLITLINES_BREAKS:
        for value in (f"x{char}GATEWAY_API_KEY=y", char):
            assert not _ok(EnvValue, value), repr(char)
            assert not _ok(types.Text, value), repr(char)
            assert not _ok(types.HomePath, f"~/a{value}"), repr(char)
    assert _ok(EnvValue, "tab\tinside") and _ok(EnvValue, "déjà vu ☺")


@pytest.mark.parametrize(
    "row",
    [
        "env_value_line_separator",
        "lane_env_paragraph_separator",
        "reason_line_separator",
        "secret_path_line_separator",
        "env_key_line_separator",
    ],
)
def test_a_line_or_paragraph_separator_is_refused_at_its_line(tmp_path: Path, row: str) -> None:
    (problem,) = _refusals(tmp_path, row)
    assert "GATEWAY_API_KEY" not in problem  # the value is never shown


def test_the_box_splits_env_only_at_line_feeds_and_a_converge_changes_nothing_twice(
    tmp_path: Path,
) -> None:
    """A value holding U+2028 (written by an older loader) was two lines to str.splitlines():
    the key read as absent and was appended on every converge, and the text after the
    separator read as a GATEWAY_API_KEY entry."""
    value = "x\u2028GATEWAY_API_KEY=\u2029bar"
    text = "A=1\r\nFOO_MODE='" + value + "'\nB=\x0c2\n"
    parsed = converge.parse_env(text)
    assert sorted(parsed) == ["A", "B", "FOO_MODE"]
    assert parsed["FOO_MODE"] == (value, 1) and parsed["A"] == ("1", 0)
    env = tmp_path / ".env"
    env.write_bytes(text.encode("utf-8"))
    env.chmod(0o600)
    box = converge.Box({"directory": str(tmp_path), "project": "lobes", "compose_files": []})
    want = {"FOO_MODE": value, "A": "2"}
    assert converge.write_env(box, list(want), want) == ["A"]
    after = env.read_bytes()
    assert after == text.replace("A=1", "A=2").encode("utf-8")
    assert converge.write_env(box, list(want), want) == []
    assert env.read_bytes() == after


def test_the_box_splits_as_it_did_wherever_there_is_no_other_break() -> None:
    for text in ["", "A=1", "A=1\n", "A=1\r\nB=2\r\n", "A=1\n\nB=2", "\n", "A=1\r", "A=1\n\r"]:
        assert converge.env_lines(text) == text.splitlines(), repr(text)
        assert converge.env_lines(text, keepends=True) == text.splitlines(True), repr(text)
    assert converge.env_lines("a\u2028b\x85c\rd\n", keepends=True) == ["a\u2028b\x85c\rd\n"]


# -- 2. an overlay's values are never shown, wherever it lives --------------------------------
def test_an_overlay_anywhere_is_described_never_quoted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An inventory may name any file in the repository as an overlay; if it names a
    credentials file by mistake, the refusal says what shape it found, never a value from it."""
    root = _fixture(tmp_path, monkeypatch)
    docker = root / "config.json"
    docker.write_text('{"auths": {"registry.lan:5000": {"auth": "c2VjcmV0OnBhc3M="}}}\n')
    _add_to_inventory(root, f"image_overlay: {docker}\n")
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(root)
    assert [p.path for p in caught.value.problems] == ["auths"]
    assert "c2VjcmV0" not in str(caught.value) and "registry.lan" not in str(caught.value)


def test_an_overlay_inside_the_repository_still_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _fixture(tmp_path, monkeypatch)
    (root / "facts" / "overlay").mkdir(parents=True)
    digest = "vllm/vllm-openai@sha256:" + "a" * 64
    (root / "facts" / "images.yaml").write_text(f"vllm: {digest}\n")
    for box in ("thor", "spark"):
        (root / "facts" / "overlay" / f"{box}.yaml").write_text(
            "memory:\n  mem_available_floor_gib: 3\n"
        )
    _add_to_inventory(
        root, f"image_overlay: {root}/facts/images.yaml\nbox_overlay: facts/overlay/{{box}}.yaml\n"
    )
    fleet = load_fleet(root)
    assert fleet.boxes["thor"].images["vllm"] == digest
    assert fleet.boxes["spark"].memory.mem_available_floor_gib == 3


def test_an_image_overlay_value_is_described_never_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _fixture(tmp_path, monkeypatch)
    (root / "facts").mkdir()
    (root / "facts" / "images.yaml").write_text(
        "auths:\n  registry.lan:5000:\n    auth: c2VjcmV0OnBhc3M=\nvllm: c2VjcmV0LXRhZw\n"
    )
    _add_to_inventory(root, "image_overlay: facts/images.yaml\n")
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(root)
    want = (
        "expected an image reference pinned by digest (repo@sha256:<64 hex>), got {} "
        "(an overlay's values are not shown)"
    )
    assert [str(p) for p in caught.value.problems] == [
        f"facts/images.yaml:1:1: auths: {want.format('a mapping')}",
        f"facts/images.yaml:4:1: vllm: {want.format('a text that is not one')}",
    ]


def test_a_box_overlay_value_is_never_shown_in_a_validation_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _fixture(tmp_path, monkeypatch)
    (root / "facts").mkdir()
    (root / "facts" / "thor.yaml").write_text("gateway:\n  port: c2VjcmV0OnBhc3M=\n")
    (root / "facts" / "spark.yaml").write_text("{}\n")
    _add_to_inventory(root, "box_overlay: facts/{box}.yaml\n")
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(root)
    assert [str(p) for p in caught.value.problems] == [
        "facts/thor.yaml:2:3: gateway.port: expected an integer, got str "
        "(value not shown: an overlay's)"
    ]


# -- 3. the caches fingerprint every file parsed, and the way to it -----------------------------
def test_a_layer_no_box_uses_is_fingerprinted_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _fixture(tmp_path, monkeypatch)
    inv = _inventory(root)
    inv.write_text(inv.read_text().replace("[gpu, jetson]", "[gpu, jetson, dgx]", 1))
    dgx = root / "group_vars" / "dgx.yaml"
    dgx.write_text("gpu_memory_budget: 0.8\n")  # a group with no member: parsed, judged
    fleet = load_fleet_cached(root, "hosts")
    remembered_inputs(fleet, inv)
    assert str(dgx) in map(str, fleet.inputs)
    assert cached_fleet(root, inv) is not None and cached_inputs(root, inv) is not None
    dgx.write_text("gpu_memory_budget: &b 0.8\n")  # refused by the loader; same listing
    assert cached_fleet(root, inv) is None
    assert cached_inputs(root, inv) is None
    with pytest.raises(DesiredStateError):
        load_fleet_cached(root, "hosts")


def _shared_layer(root: Path) -> Path:
    """group_vars/jetson.yaml as a symlink to a file of the repository."""
    shared = root / "shared"
    shared.mkdir()
    layer = root / "group_vars" / "jetson.yaml"
    layer.rename(shared / "jetson.yaml")
    layer.symlink_to(Path("..") / "shared" / "jetson.yaml")
    return layer


def test_a_layer_symlink_swapped_for_one_leaving_the_repository_misses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fingerprint, "RACY_NS", 0)  # stamps recorded: the warm path is taken
    root = _fixture(tmp_path, monkeypatch)
    layer = _shared_layer(root)
    fleet = load_fleet_cached(root, "hosts")
    remembered_inputs(fleet, _inventory(root))
    outside = tmp_path / "outside.yaml"
    shutil.copyfile(root / "shared" / "jetson.yaml", outside)  # the same bytes
    layer.unlink()
    layer.symlink_to(outside)
    assert cached_fleet(root, _inventory(root)) is None
    assert cached_inputs(root, _inventory(root)) is None
    with pytest.raises(DesiredStateError) as caught:
        load_fleet_cached(root, "hosts")
    assert "outside the repository" in str(caught.value)


def test_a_directory_symlink_swapped_for_one_leaving_the_repository_misses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fingerprint, "RACY_NS", 0)
    root = _fixture(tmp_path, monkeypatch)
    (root / "group_vars").rename(root / "layers")
    (root / "group_vars").symlink_to("layers")
    load_fleet_cached(root, "hosts")
    assert cached_fleet(root, _inventory(root)) is not None
    shutil.copytree(root / "layers", tmp_path / "copy")  # the same files, elsewhere
    (root / "group_vars").unlink()
    (root / "group_vars").symlink_to(tmp_path / "copy")
    assert cached_fleet(root, _inventory(root)) is None


def test_a_warm_hit_through_symlinks_reads_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fingerprint, "RACY_NS", 0)
    root = _fixture(tmp_path, monkeypatch)
    _shared_layer(root)
    load_fleet_cached(root, "hosts")

    def no_read(_path: Path) -> str:
        raise AssertionError("an input file was read again")

    monkeypatch.setattr(fingerprint, "file_digest", no_read)
    assert cached_fleet(root, _inventory(root)) is not None


def test_a_file_that_became_a_symlink_misses_even_with_its_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _fixture(tmp_path, monkeypatch)
    load_fleet_cached(root, "hosts")
    layer = root / "group_vars" / "jetson.yaml"
    outside = tmp_path / "outside.yaml"
    layer.rename(outside)
    layer.symlink_to(outside)
    assert cached_fleet(root, _inventory(root)) is None


# -- 4. no layer sets `name` ----------------------------------------------------------------------
@pytest.mark.parametrize("row", ["layer_sets_name_unknown", "layer_sets_name_other_box"])
def test_a_layer_setting_name_is_refused_at_its_line(tmp_path: Path, row: str) -> None:
    _refusals(tmp_path, row)


# -- 5. the loader refuses what the box would refuse at apply time -------------------------------
@pytest.mark.parametrize(
    "row",
    [
        "directory_is_home",
        "secret_path_is_home",
        "boot_timeout_over_a_week",
        "health_timeout_over_a_week",
        "floor_over_box_bound",
        "env_value_quote_and_dollar",
    ],
)
def test_what_a_converge_refuses_is_refused_at_load(tmp_path: Path, row: str) -> None:
    _refusals(tmp_path, row)


def test_the_bounds_are_the_box_programs_own() -> None:
    assert models.MAX_TIMEOUT_S == converge.MAX_TIMEOUT_S
    for floor, box_ok in ((models.MAX_FLOOR_GIB, True), (models.MAX_FLOOR_GIB + 0.5, False)):
        payload = {**base_payload("snapshots", "me"), "memory": {"floor_gib": floor}}
        assert _box_ok(converge.validate_payload, payload) == box_ok
        memory = {"drop_caches_before_boot": True, "mem_available_floor_gib": floor}
        assert _ok(MemoryPolicy, memory) == box_ok


@pytest.mark.parametrize("seconds", [-1, 0, 1, 900, BOX_MAX_S, BOX_MAX_S + 1, 10**12])
def test_a_timeout_is_accepted_exactly_when_the_box_accepts_it(seconds: int) -> None:
    box = _box_ok(converge._timeout, "t", seconds)
    assert (
        _ok(GatewaySpec, {"image": "gateway", "auth": "open", "health_timeout_s": seconds}) == box
    )


HOME_PATHS = [
    "~", "~/", "~/.", "~//", "~/./", "~/.lobes", "~/a/./b", "~//x", "~/a/..", "~/../x",
    "~/a/../b", "~/my dir/x", "~/x\x01", "~/.lobes/.secrets.env",
]  # fmt: skip


@pytest.mark.parametrize("value", HOME_PATHS)
def test_a_home_path_is_accepted_exactly_when_the_box_accepts_it(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The box gets the loader's normalized path; for `~/...` it gets the same place."""
    monkeypatch.setenv("HOME", "/home/deploy")  # what the box's expanduser reads
    ok = _ok(types.InsideHome, value)
    assert ok == _box_ok(converge._home_path, "d", value, "/home/deploy")
    if ok:
        normal = TypeAdapter(types.InsideHome).validate_python(value)
        assert _box_ok(converge._home_path, "d", normal, "/home/deploy")


@pytest.mark.parametrize(
    "value",
    ["plain", "", "it's", "$HOME", "it's $HOME", '"$x"', "a'b'$", "back\\slash", "a b", "#x", "=",
     "x" * 65536, "x" * 65537],
)  # fmt: skip
def test_an_env_value_is_accepted_exactly_when_the_box_can_write_it(value: str) -> None:
    def writable(text: str) -> bool:
        return _box_ok(converge._env_value, "k", text) and _box_ok(converge.quote, text)

    assert _ok(EnvValue, value) == writable(value)


# -- 6. an `env:` number reaches `.env` as it is written, or is refused ---------------------------
@pytest.mark.parametrize(
    "row",
    [
        "env_number_leading_zeros",
        "env_number_underscore",
        "env_number_hex",
        "env_number_exponent",
        "env_number_octal_looking",
        "env_boolean_capitalized",
    ],
)
def test_an_env_number_written_other_than_it_reads_is_refused(tmp_path: Path, row: str) -> None:
    (problem,) = _refusals(tmp_path, row)
    assert "quote it" in problem


def test_canonical_numbers_and_quoted_text_reach_env_as_written(tmp_path: Path) -> None:
    pins = "  A: 8192\n  B: 0.45\n  C: true\n  D: '0022'\n  E: -3\n  F: 1.5e+20\n  G: false\n"
    root = _fleet_with(tmp_path, "group_vars/thor.yaml", "env:\n", "env:\n" + pins)
    thor = load_fleet(root).boxes["thor"]
    env = {key: env_text(value) for key, value in thor.env.items()}
    assert {k: env[k] for k in "ABCDEFG"} == {
        "A": "8192", "B": "0.45", "C": "true", "D": "0022", "E": "-3", "F": "1.5e+20", "G": "false",
    }  # fmt: skip


def test_a_number_only_outside_env_may_be_written_in_any_form(tmp_path: Path) -> None:
    root = _fleet_with(
        tmp_path, "group_vars/gpu.yaml", "boot_timeout_s: 900", "boot_timeout_s: 9_00"
    )
    assert load_fleet(root).boxes["thor"].lanes["embed"].boot_timeout_s == 900


REWRITE_TEXT = """\
env: {A: 0022, B: 1_000, C: 0x10, D: 1e3, E: 010, F: TRUE, G: 8192, H: 0.45, I: true, J: '0022'}
lanes:
  w:
    env:
      X: +5
      Y: -0
      Z: .5
      W: 1.0
      V: 0o17
other: 007
"""


@pytest.mark.parametrize("text", [REWRITE_TEXT, REWRITE_TEXT + "tagged: !!int '0022'\n"])
def test_both_yaml_readers_mark_the_same_rewritten_values(text: str) -> None:
    usual = parse_text(text, "f.yaml")
    located = parse_text(text, "f.yaml", located_only=True)
    assert usual.data == located.data
    assert usual.rewritten == located.rewritten
    expected = {("env", k) for k in "ABCDEF"} | {("lanes", "w", "env", k) for k in "XYZV"}
    assert located.rewritten - {("tagged",)} == expected | {("other",)}


def test_the_c_reader_marks_them_itself() -> None:
    plain = yaml_fast.plain_source(REWRITE_TEXT, "f.yaml", max_nodes=MAX_NODES, max_depth=MAX_DEPTH)
    assert plain is not None
    assert plain[2] == parse_text(REWRITE_TEXT, "f.yaml", located_only=True).rewritten


@pytest.mark.parametrize("value", [True, False, 0, -7, 8192, 0.45, 1e20, 1.5e-7, "x", ""])
def test_the_text_judged_is_the_text_written_to_env(value: Any) -> None:
    assert env_text(value) == yaml_scalars.as_text(value)


# -- 7. hosts the resolver would read as addresses -------------------------------------------------
@pytest.mark.parametrize("row", ["host_hex_dotted", "host_hex_number"])
def test_a_hex_address_as_a_host_is_refused_at_its_line(tmp_path: Path, row: str) -> None:
    _refusals(tmp_path, row)


@pytest.mark.parametrize(
    "value", ["0x0a.0x00.0x00.0x01", "0x7f000001", "0x7f000001.", "0x7f.0x1", "0XA.0.0.0x1", "0xa"]
)
def test_names_inet_aton_reads_as_addresses_are_refused(value: str) -> None:
    assert not types.is_host(value)
    assert not _ok(types.Host, value)


@pytest.mark.parametrize("value", ["deadbeef", "cafe.babe", "face", "0x", "x0a.lan", "10.0.0.11"])
def test_names_that_only_look_hex_are_still_hosts(value: str) -> None:
    assert types.is_host(value)


# -- 8. a wrong type names the shape the key wants ------------------------------------------------
@pytest.mark.parametrize("row", ["model_key_null", "model_key_list"])
def test_a_model_key_of_the_wrong_type_names_its_own_shape(tmp_path: Path, row: str) -> None:
    (problem,) = _refusals(tmp_path, row)
    assert "{secret: NAME}" not in problem


def test_secret_slots_still_ask_for_a_secret_reference(tmp_path: Path) -> None:
    root = _fleet_with(
        tmp_path,
        "group_vars/thor.yaml",
        "  VLLM_GDN_DECODE_KERNEL: triton",
        "  VLLM_GDN_DECODE_KERNEL: [1]",
    )
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(root)
    assert [str(p) for p in caught.value.problems] == [
        "group_vars/thor.yaml:5:3: env.VLLM_GDN_DECODE_KERNEL: expected a bool, a number, an "
        "integer, a {secret: NAME} or a string, got list [1]"
    ]


def test_a_box_named_index_is_refused_at_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot keeps each box as BOX.json beside its index.json: `index` is no box's name."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "repo"
    shutil.copytree(Path(__file__).resolve().parents[2] / "examples" / "lab-incidents", root)
    inventory = root / "inventory" / "lab.yaml"
    lines = inventory.read_text(encoding="utf-8").splitlines(keepends=True)
    at = lines.index("  orin:\n")
    lines[at] = "  index:\n"
    inventory.write_text("".join(lines), encoding="utf-8")
    with pytest.raises(DesiredStateError) as caught:
        load_fleet(root, "lab")
    assert [str(p) for p in caught.value.problems] == [
        f"inventory/lab.yaml:{at + 1}:3: boxes.index: a box cannot be named 'index': a snapshot "
        "keeps its index as index.json"
    ]
