"""`reconcile import` on hostile or odd observations and outputs: each test copies
examples/lab-incidents (and its snapshot) into tmp_path, edits what the review found, and checks
the import says so instead of writing something wrong, deleting something or a traceback."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from reconciler.cli import main
from reconciler.desired.load import load_fleet
from reconciler.importer.adopt import adopt_box
from reconciler.importer.images import catalog, running_digest
from reconciler.importer.inventory import copied_inventory
from reconciler.importer.write import OutputExists, OutputRefused, build, check_free
from reconciler.observe.observe import load_snapshot
from reconciler.report.values import free_text

REPO = Path(__file__).resolve().parents[2]
INCIDENTS = REPO / "examples/lab-incidents"
DIGEST = "0e295fa0b32fe8321e3c10e8ef452c2c5e11cb05c45e08b4cb82d257233032b8"
LAB_REF = f"10.77.0.1:5000/vllm/vllm-openai@sha256:{DIGEST}"
MIRROR_REF = f"mirror.example:5000/vllm/vllm-openai@sha256:{DIGEST}"
OTHER_KEY = {"secret": "hmac:" + "e" * 64}  # a digest no file of the example holds

Collected = dict[str, Any]


# -- helpers ------------------------------------------------------------------------------------
@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    """A copy of the example (its snapshot inside), to edit."""
    root = tmp_path / "fleet"
    shutil.copytree(INCIDENTS, root)
    return root


def edit_box(snapshot: Path, box: str, edit: Callable[[Collected], None]) -> None:
    """Edit what the collector sent for `box`; the index's sha256 follows, if it has one."""
    path = snapshot / f"{box}.json"
    answer = json.loads(path.read_text(encoding="utf-8"))
    edit(answer["collected"])
    data = json.dumps(answer, indent=1).encode("utf-8")
    path.write_bytes(data)
    index_path = snapshot / "index.json"
    index = json.loads(index_path.read_text(encoding="utf-8"))
    if isinstance(index.get("sha256"), dict):
        index["sha256"][box] = hashlib.sha256(data).hexdigest()
        index_path.write_text(json.dumps(index), encoding="utf-8")


def drop_boxes(snapshot: Path, *boxes: str) -> None:
    index_path = snapshot / "index.json"
    index = json.loads(index_path.read_text(encoding="utf-8"))
    index["boxes"] = [b for b in index["boxes"] if b not in boxes]
    for box in boxes:
        (snapshot / f"{box}.json").unlink()
        if isinstance(index.get("sha256"), dict):
            index["sha256"].pop(box, None)
    index_path.write_text(json.dumps(index), encoding="utf-8")


def run_import(
    capsys: pytest.CaptureFixture[str], root: Path, *args: str, snapshot: Path | None = None
) -> tuple[int, str]:
    snap = str(snapshot or root / "snapshot")
    code = main(["--root", str(root), "-i", "lab", "import", "--from-snapshot", snap, *args])
    out = capsys.readouterr()
    return code, out.out + out.err


def container(collected: Collected, service: str) -> dict[str, Any]:
    for c in collected["docker"]["containers"]:
        if c["name"] == f"model-gear-{service}":
            return c  # the answer's own dict: edits go into the snapshot
    raise AssertionError(f"no container {service}")


def set_env(collected: Collected, key: str, value: Any, line: int = 1300) -> None:
    """Set `key` in the box's `.env` (replacing its line, else adding one at `line`)."""
    lines = [entry for entry in collected["envfile"] if entry["key"] != key]
    collected["envfile"] = [*lines, {"key": key, "line": line, "value": value}]


def findings(snapshot: Path) -> list[str]:
    """Every note adopting the snapshot's boxes makes, as `box: what`."""
    _, observations = load_snapshot(snapshot)
    docs = {b: o.document for b, o in observations.items() if o.document is not None}
    refs = [running_digest(d, c) for d in docs.values() for c in d.containers]
    names = catalog(r for r in refs if r)
    out = []
    for box, doc in docs.items():
        _, view = adopt_box(box, doc, names, set(docs))
        out += [f"{f.box}: {f.what}" for f in view.findings]
    return out


def layer(root: Path, name: str) -> Any:
    return YAML().load((root / "group_vars" / f"{name}.yaml").read_text(encoding="utf-8"))


def listing(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


# -- 1. one digest from two registries -----------------------------------------------------------
def test_one_digest_from_two_registries_keeps_both_references(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def mirrored(collected: Collected) -> None:
        for c in collected["docker"]["containers"]:
            if c["image_ref"] == LAB_REF:
                c["image_ref"] = MIRROR_REF

    edit_box(fleet / "snapshot", "spark", mirrored)
    out = tmp_path / "adopted"
    code, text = run_import(capsys, fleet, "--output", str(out))
    assert code == 2, text
    adopted = load_fleet(out, "lab")
    spark, thor = adopted.boxes["spark"], adopted.boxes["thor"]
    # Each box pulls from where it pulled: one name standing for both sent one box elsewhere.
    assert spark.image_ref(spark.lanes["primary"].image) == MIRROR_REF
    assert thor.image_ref(thor.lanes["worker"].image) == LAB_REF
    images = dict(layer(out, "all")["images"])
    assert LAB_REF in images.values() and MIRROR_REF in images.values()


def test_catalog_never_gives_two_references_one_name() -> None:
    refs = [
        LAB_REF,
        MIRROR_REF,
        f"10.77.0.1:5000/vllm/vllm-openai@sha256:{'b' * 64}",
        f"a.b/x@sha256:{DIGEST}",  # a.b and a-b read alike as names
        f"a-b/x@sha256:{DIGEST}",
        f"reg/vllm_openai_0e295fa0b32f@sha256:{'c' * 64}",  # named like another's digest name
        f"reg/vllm_openai_0e295fa0b32f_10_77_0_1_5000_vllm@sha256:{'d' * 64}",
        f"reg/x_0e295fa0b32f_a_b_2@sha256:{'e' * 64}",
    ]
    names = catalog(refs)
    assert sorted(names) == sorted(refs)
    assert len(set(names.values())) == len(refs), names
    assert all(n[0].isalpha() and n.replace("_", "").isalnum() for n in names.values())
    assert catalog(reversed(refs)) == names  # stable for the same set


# -- 2. a key in use that no file holds ----------------------------------------------------------
def no_shell_key(collected: Collected) -> None:
    """thor's gateway key came from the login shell's export (incident #209): gone."""
    del collected["login_shell"]["exports"]["GATEWAY_API_KEY"]


def running_key(collected: Collected) -> Any:
    return container(collected, "gateway")["env"]["GATEWAY_API_KEY"]


@pytest.mark.parametrize("dotenv", ["no line", "another value"])
def test_a_running_key_no_file_holds_becomes_a_placeholder(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], dotenv: str
) -> None:
    def hostile(collected: Collected) -> None:
        no_shell_key(collected)
        if dotenv == "another value":
            set_env(collected, "GATEWAY_API_KEY", OTHER_KEY)

    edit_box(fleet / "snapshot", "thor", hostile)
    out = tmp_path / "adopted"
    code, text = run_import(capsys, fleet, "--output", str(out))
    assert code == 2, text
    source = load_fleet(out, "lab").boxes["thor"].secrets["gateway_api_key"]
    # Never `.env`: its other value would rotate the live key, its missing line fail apply.
    assert source.source == "box_file" and source.key == "GATEWAY_API_KEY"
    assert source.path == "~/.lobes/.secrets.unfound.env"
    found = text.split("found while importing:", 1)[1]
    assert "thor: the GATEWAY_API_KEY in use (docker inspect (model-gear-gateway" in found
    assert "no file the import can point to" in found and "not adopted" in found
    summary = next(line for line in text.splitlines() if line.strip().startswith("thor:"))
    assert summary.endswith("; not adopted, a placeholder: secrets.gateway_api_key")
    assert "adopted a secret" not in text  # nothing says what runs was adopted
    comment = layer(out, "thor")["secrets"].ca.items["gateway_api_key"]
    assert "placeholder" in str(comment)


def test_a_running_key_only_dotenv_holds_is_referenced_there(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def same_in_dotenv(collected: Collected) -> None:
        no_shell_key(collected)
        set_env(collected, "GATEWAY_API_KEY", running_key(collected))

    edit_box(fleet / "snapshot", "thor", same_in_dotenv)
    out = tmp_path / "adopted"
    code, text = run_import(capsys, fleet, "--output", str(out))
    assert code == 2, text
    source = load_fleet(out, "lab").boxes["thor"].secrets["gateway_api_key"]
    assert (source.path, source.key) == ("~/.lobes/.env", "GATEWAY_API_KEY")
    assert "held by no file" not in text and "placeholder" not in text


# -- 3. a stale gateway_origin -------------------------------------------------------------------
def test_a_stale_gateway_origin_is_dropped(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = fleet / "inventory" / "lab.yaml"
    yaml = YAML()
    data = yaml.load(inventory.read_text(encoding="utf-8"))
    data["boxes"]["spark"]["gateway_origin"] = "http://old.example:8000"
    data["boxes"]["thor"]["gateway_origin"] = "http://older.example:8000"
    with inventory.open("w", encoding="utf-8") as f:
        yaml.dump(data, f)
    edit_box(
        fleet / "snapshot",
        "thor",
        lambda c: set_env(c, "GATEWAY_SELF_ORIGIN", "http://thor.example:8000", 1199),
    )
    text = copied_inventory(
        inventory, fleet, ["thor", "spark"], {"thor": "http://thor.example:8000"}
    )
    boxes = YAML().load(text)["boxes"]
    assert "gateway_origin" not in boxes["spark"]  # spark's .env announces the default one
    assert boxes["thor"]["gateway_origin"] == "http://thor.example:8000"
    out = tmp_path / "adopted"
    code, printed = run_import(capsys, fleet, "--output", str(out))
    assert code == 2, printed
    adopted = load_fleet(out, "lab").inventory.boxes
    assert adopted["spark"].gateway_origin is None
    assert adopted["thor"].gateway_origin == "http://thor.example:8000"


# -- 4. boxes of the inventory the snapshot lacks ------------------------------------------------
@pytest.mark.parametrize("dropped", [("orin",), ("orin", "spark")], ids="+".join)
def test_boxes_the_snapshot_lacks_are_refused_by_name(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], dropped: tuple[str, ...]
) -> None:
    drop_boxes(fleet / "snapshot", *dropped)
    out = tmp_path / "adopted"
    code, text = run_import(capsys, fleet, "--output", str(out))
    # README: 1 refused ("a box not observed"); never written without the box, unsaid.
    assert code == 1, text
    for box in dropped:
        assert f"error: {box} not in the snapshot" in text
    assert "nothing written" in text and "adopted" not in text.replace("--output", "")
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["fleet"]
    # Named, the boxes it holds are adopted alone.
    kept = [b for b in ("thor", "spark", "orin") if b not in dropped]
    code, text = run_import(capsys, fleet, *kept, "--output", str(out))
    assert code == 2 and list(load_fleet(out, "lab").boxes) == kept


# -- 5. odd values: notes, not tracebacks --------------------------------------------------------
@pytest.mark.parametrize("host_port", ["", "8000-8001"], ids=["chosen-at-start", "a-range"])
def test_a_gateway_port_that_is_not_one_port_is_a_note(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], host_port: str
) -> None:
    def published(collected: Collected) -> None:
        gateway = container(collected, "gateway")
        gateway["ports"] = {"8000/tcp": [{"HostIp": "", "HostPort": host_port}]}

    edit_box(fleet / "snapshot", "spark", published)
    out = tmp_path / "adopted"
    code, text = run_import(capsys, fleet, "--output", str(out))
    assert code == 2, text
    assert f"spark: the gateway publishes 8000/tcp on host port {host_port!r}, not one port" in text
    assert load_fleet(out, "lab").boxes["spark"].gateway.port == 8000


@pytest.mark.parametrize("beat", ["²", "٣", "0", "soon"])
def test_a_heartbeat_that_is_not_ascii_digits_is_a_note(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], beat: str
) -> None:
    def odd_beat(collected: Collected) -> None:
        set_env(collected, "LOBES_MESH_HEARTBEAT_S", beat, 1190)
        for c in collected["docker"]["containers"]:  # started with that .env
            c["env"]["LOBES_MESH_HEARTBEAT_S"] = beat

    edit_box(fleet / "snapshot", "orin", odd_beat)
    out = tmp_path / "adopted"
    code, text = run_import(capsys, fleet, "--output", str(out))
    assert code == 2, text
    assert f"orin: LOBES_MESH_HEARTBEAT_S in .env:1190 is {beat!r}, not a whole number" in text
    assert load_fleet(out, "lab").boxes["orin"].mesh.heartbeat_s == 60


def test_a_snapshot_path_that_is_not_utf8_is_written_escaped(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    odd = tmp_path / os.fsdecode(b"snap-\xff\x1b")
    shutil.copytree(fleet / "snapshot", odd)
    out = tmp_path / "adopted"
    code, text = run_import(capsys, fleet, "--output", str(out), snapshot=odd)
    assert code == 2, text
    header = (out / "group_vars" / "all.yaml").read_text(encoding="utf-8").splitlines()[0]
    assert "the snapshot " + str(tmp_path) + "/snap-\\udcff\\x1b (" in header
    assert "--from-snapshot " + str(tmp_path) + "/snap-\\udcff\\x1b" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["adopted", "fleet", odd.name])


def test_build_discards_its_directory_whatever_stops_it(tmp_path: Path) -> None:
    with pytest.raises(OutputRefused, match="not UTF-8"):
        build(tmp_path / "adopted", {"group_vars/all.yaml": "ok", "inventory/lab.yaml": "\udcff"})
    assert list(tmp_path.iterdir()) == []  # no `.adopted.import-*` left behind


# -- 7. notes the scrubber would mask ------------------------------------------------------------
def test_notes_read_the_same_after_the_report_scrubs_them(fleet: Path) -> None:
    snapshot = fleet / "snapshot"

    def open_gateway_holding_a_key(collected: Collected) -> None:
        key = container(collected, "vllm-embed")["env"]["GATEWAY_API_KEY"]
        container(collected, "gateway")["env"]["GATEWAY_API_KEY"] = key
        set_env(collected, "GATEWAY_API_KEY", key)

    edit_box(snapshot, "orin", open_gateway_holding_a_key)  # the probe still answers 200
    edit_box(snapshot, "thor", lambda c: set_env(c, "GATEWAY_API_KEY", OTHER_KEY))
    notes = findings(snapshot)
    # Secrets show as `a secret (***)` before scrubbing: nothing else may change.
    assert [free_text(n) for n in notes] == notes
    nightly = next(n for n in notes if n.startswith("orin: lanes share VLLM_NIGHTLY_IMAGE"))
    assert nightly.endswith(f"adopted {LAB_REF} for all")  # the reference, not its name
    assert (
        "orin: .env:1300 holds a GATEWAY_API_KEY, yet the gateway serves callers without "
        "one; adopted auth: open" in notes
    )
    assert any(
        n.startswith("thor: .env:1300 sets GATEWAY_API_KEY to a secret (***)") for n in notes
    )


# -- 8. --force replaces only what an import wrote -----------------------------------------------
def test_force_refuses_the_current_directory_touching_nothing(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine", encoding="utf-8")
    monkeypatch.chdir(work)
    before = listing(tmp_path)
    code, text = run_import(capsys, fleet, "--output", ".", "--force")
    assert code == 1 and f"error: --output {work} is or holds the current directory" in text
    assert "nothing written" in text and listing(tmp_path) == before


def test_force_refuses_the_root_and_the_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for output, why in ((Path("/"), "root directory"), (home, "your home"), (tmp_path, "home")):
        with pytest.raises(OutputExists, match=why):
            check_free(output, True)
    assert listing(tmp_path) == ["home"]


def test_force_replaces_only_an_empty_or_imported_directory(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "adopted"
    out.mkdir()
    (out / "mine.txt").write_text("keep", encoding="utf-8")
    code, text = run_import(capsys, fleet, "--output", str(out), "--force")
    assert code == 1 and "is not a repository `reconcile import` wrote (it holds mine.txt)" in text
    assert listing(out) == ["mine.txt"]
    (out / "mine.txt").unlink()
    code, text = run_import(capsys, fleet, "--output", str(out), "--force")  # empty: replaced
    assert code == 2, text
    code, text = run_import(capsys, fleet, "--output", str(out), "--force")  # imported: replaced
    assert code == 2, text
    (out / "group_vars" / "notes.md").write_text("mine", encoding="utf-8")
    code, text = run_import(capsys, fleet, "--output", str(out), "--force")
    assert code == 1 and "(it holds group_vars/notes.md)" in text
    assert (out / "group_vars" / "notes.md").is_file()
    (out / "group_vars" / "notes.md").unlink()
    hand = tmp_path / "hand-written"
    shutil.copytree(fleet / "group_vars", hand / "group_vars")
    code, text = run_import(capsys, fleet, "--output", str(hand), "--force")
    assert code == 1 and "no group_vars layer says `reconcile import` wrote it" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adopted", "fleet", "hand-written"]


# -- a pin no converge could write back ----------------------------------------------------------
def test_a_pin_no_quoting_reads_back_is_left_out_not_the_whole_import(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A `.env` pin holding both ' and $ (the loader refuses it: the box's writer could not
    write it back unchanged) costs that key only, said by box and key; the box keeps it."""
    odd = "triton's $kernel"

    def pinned(collected: Collected) -> None:
        set_env(collected, "VLLM_GDN_DECODE_KERNEL", odd)
        for c in collected["docker"]["containers"]:  # the lanes carry it through env_file
            if c["env"] and "VLLM_GDN_DECODE_KERNEL" in c["env"]:
                c["env"]["VLLM_GDN_DECODE_KERNEL"] = odd

    edit_box(fleet / "snapshot", "thor", pinned)
    out = tmp_path / "adopted"
    code, text = run_import(capsys, fleet, "--output", str(out))
    assert code == 2, text
    assert "thor: VLLM_GDN_DECODE_KERNEL is left out of the adopted state" in text
    assert odd not in text  # the value is never shown
    adopted = load_fleet(out, "lab")  # the rest of the mesh is adopted and validates
    assert sorted(adopted.boxes) == ["orin", "spark", "thor"]
    assert "VLLM_GDN_DECODE_KERNEL" not in adopted.boxes["thor"].env


def test_a_compose_control_variable_pinned_in_env_is_left_out_not_the_whole_import(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`COMPOSE_PROJECT_NAME` in a box's `.env` (the lanes carry it through env_file) would be
    adopted as an `env:` pin the loader refuses (desired/checks.py `_control_pins`), and the
    whole import with it: it is left out, said by box and key."""

    def pinned(collected: Collected) -> None:
        set_env(collected, "COMPOSE_PROJECT_NAME", "other")
        for c in collected["docker"]["containers"]:
            if c["env"] and "VLLM_GDN_DECODE_KERNEL" in c["env"]:
                c["env"]["COMPOSE_PROJECT_NAME"] = "other"

    edit_box(fleet / "snapshot", "thor", pinned)
    out = tmp_path / "adopted"
    code, text = run_import(capsys, fleet, "--output", str(out))
    assert code == 2, text
    assert "thor: COMPOSE_PROJECT_NAME is left out of the adopted state" in text
    adopted = load_fleet(out, "lab")
    assert "COMPOSE_PROJECT_NAME" not in adopted.boxes["thor"].env
