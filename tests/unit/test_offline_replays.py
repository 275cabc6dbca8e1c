"""Every offline replay the READMEs document works on a fresh clone, where no lab ever ran.

The replays (`reconcile ... --from-snapshot PATH`) are read from the README texts, so a replay
documented tomorrow is tested without touching this file. Each runs in a copy of the
repository's files (what `git clone` would give: no `.lab/`, no cache) and must exit with its
documented code, never 1, and print no traceback. A saved snapshot carries the desired-state
facts it was judged against (reconciler/desired/facts.py): the audit fixtures replay with the
verdicts their scenarios expect, and a snapshot saved now replays without the files it was
saved from.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_audit_snapshots import SCENARIOS

REPO = Path(__file__).resolve().parents[2]
READMES = ("README.md", "examples/*/README.md")
_EXIT_CODE = re.compile(r"exit code (\d)")


# -- the documented replays ----------------------------------------------------------------------
def documented_replays() -> list[tuple[str, list[str], int | None]]:
    """(README, argv after `reconcile`, the exit code it states or None) of each replay."""
    found = []
    for pattern in READMES:
        for readme in sorted(REPO.glob(pattern)):
            text = readme.read_text(encoding="utf-8")
            for start, command in _commands(text):
                argv = _reconcile_argv(command)
                if argv is None or "--from-snapshot" not in argv:
                    continue
                if argv[argv.index("--from-snapshot") + 1].isupper():  # a placeholder: DIR
                    continue
                stated = _EXIT_CODE.findall(_paragraph_before(text, start))
                name = readme.relative_to(REPO).as_posix()
                found.append((name, argv, int(stated[-1]) if stated else None))
    return found


def _reconcile_argv(command: str) -> list[str] | None:
    """The arguments of a `reconcile ...` command line (a shell comment dropped), else None."""
    if not command.startswith("reconcile "):
        return None
    return shlex.split(command, comments=True)[1:]  # a documented command is valid shell


def _commands(text: str) -> list[tuple[int, str]]:
    """(offset, text) of every inline code span and every line of a code block (indented or
    fenced), with `\\` continuations joined and runs of white space made one space."""
    out = []
    fenced = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
    for block in fenced.finditer(text):
        out += _block_lines(block.start(), block.group(1))
    prose = fenced.sub(lambda m: " " * len(m.group(0)), text)
    for block in re.finditer(r"(?:^(?: {4}|\t)[^\n]*\n?)+", prose, re.M):
        out += _block_lines(block.start(), block.group(0))
    for span in re.finditer(r"`([^`]+)`", prose):
        out.append((span.start(), " ".join(span.group(1).split())))
    return out


def _block_lines(offset: int, block: str) -> list[tuple[int, str]]:
    joined = re.sub(r"\\\n\s*", " ", block)
    return [(offset, " ".join(line.split())) for line in joined.splitlines() if line.strip()]


def _paragraph_before(text: str, offset: int) -> str:
    """The text from the start of the paragraph (a blank line, or two before an indented
    block) up to `offset`: where a README states a command's exit code."""
    head = text[:offset]
    cut = head.rstrip("\n").rfind("\n\n")
    if head[cut + 2 :].startswith(("    ", "\t")):  # an indented block: its lead-in paragraph
        cut = head[:cut].rfind("\n\n")
    return head[max(cut, 0) :]


def expected_code(argv: list[str], stated: int | None) -> int | None:
    """The stated code; else the scenario's, for an audit fixture; else the code stated for the
    same snapshot anywhere in the READMEs; None if none is documented (then 0 or 2)."""
    if stated is not None:
        return stated
    snapshot = Path(argv[argv.index("--from-snapshot") + 1])
    if snapshot.parent == Path("tests/fixtures/audit") and snapshot.name in SCENARIOS:
        return SCENARIOS[snapshot.name][3]
    for _, other, code in _REPLAYS:
        if code is not None and other[other.index("--from-snapshot") + 1] == str(snapshot):
            return code
    return None


_REPLAYS = documented_replays()


def test_the_readmes_document_replays():
    # The replays issue 10 names; more may be documented, never fewer.
    commands = {" ".join(argv) for _, argv, _ in _REPLAYS}
    example = "examples/lab-incidents"
    assert {
        "-i lab audit --from-snapshot tests/fixtures/audit/weakest_link_proven_live",
        f"--root {example} -i lab drift --from-snapshot {example}/snapshot",
    } <= commands


def test_the_parser_finds_replays_in_every_markdown_form():
    text = (
        "Inline: `reconcile -i lab drift --from-snapshot a/b`.\n\n"
        "Replay it (exit code 2: drift):\n\n"
        "    reconcile --root x -i lab drift \\\n        --from-snapshot x/snap\n\n"
        "```sh\nreconcile -i lab audit --save-snapshot DIR   # then --from-snapshot DIR\n"
        "reconcile audit --from-snapshot c  # judged offline\n```\n"
    )
    argvs = [_reconcile_argv(c) for _, c in _commands(text)]
    assert [" ".join(a) for a in argvs if a and "--from-snapshot" in a] == [
        "audit --from-snapshot c",
        "--root x -i lab drift --from-snapshot x/snap",
        "-i lab drift --from-snapshot a/b",
    ]
    start = text.index("    reconcile --root")
    assert _EXIT_CODE.findall(_paragraph_before(text, start)) == ["2"]


# -- a fresh clone ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's files as a clone has them: tracked and new files, nothing ignored
    (no .lab/, no .venv/, no caches)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    target = tmp_path_factory.mktemp("clone") / "fleet-reconciler"
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():  # a file deleted in the working tree is still listed
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    assert not (target / ".lab").exists()
    return target


def reconcile(clone: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`reconcile` of the clone's own code, in the clone, with an empty cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env["XDG_CACHE_HOME"] = str(clone.parent / "cache")
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # the clone stays as a clone
    return subprocess.run(
        [sys.executable, "-m", "reconciler", *argv],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _check(done: subprocess.CompletedProcess[str], expected: int | None) -> None:
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output[-3000:]
    assert done.returncode != 1, done.stderr[-3000:]
    if expected is None:
        assert done.returncode in (0, 2), done.stderr[-3000:]
    else:
        assert done.returncode == expected, done.stderr[-3000:]


@pytest.mark.parametrize(
    ("readme", "argv", "stated"), _REPLAYS, ids=[f"{r}: {' '.join(a)}" for r, a, _ in _REPLAYS]
)
def test_documented_replay_works_without_a_lab(clone, readme, argv, stated):
    _check(reconcile(clone, *argv), expected_code(argv, stated))


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_audit_fixture_replays_with_its_verdicts(clone, scenario):
    _, verdicts, mesh, exit_code, codes = SCENARIOS[scenario]
    snapshot = f"tests/fixtures/audit/{scenario}"
    done = reconcile(clone, "-i", "lab", "audit", "--from-snapshot", snapshot, "--format", "json")
    _check(done, exit_code)
    doc = json.loads(done.stdout)
    assert {b["box"]: b["verdict"] for b in doc["boxes"]} == verdicts
    assert doc["mesh"]["verdict"] == mesh
    for subject, expected in codes.items():
        entry = (
            doc["mesh"]
            if subject == "mesh"
            else next(b for b in doc["boxes"] if b["box"] == subject)
        )
        assert expected <= {f["code"] for f in entry["findings"]}


def test_a_snapshot_saved_now_replays_without_the_files_it_was_judged_against(clone, tmp_path):
    """Saved with the lab's facts in .lab/ (here: a scenario's), replayed after .lab/ is gone:
    the same verdicts, from the facts the snapshot carries."""
    scenario = "weakest_link_proven_live"
    facts = clone / "tests/fixtures/audit" / scenario / "facts"
    lab = clone / ".lab"
    shutil.copytree(facts, lab)  # images.yaml and overlay/<box>.yaml, where `lab up` puts them
    saved = tmp_path / "saved"
    try:
        first = reconcile(clone, "-i", "lab", "audit", "--format", "json",
                          "--from-snapshot", f"tests/fixtures/audit/{scenario}/",
                          "--save-snapshot", str(saved))  # fmt: skip
    finally:
        shutil.rmtree(lab)
    _check(first, 2)
    index = json.loads((saved / "index.json").read_text())
    assert index["facts"] == ["images.yaml", "overlay/orin.yaml", "overlay/spark.yaml",
                              "overlay/thor.yaml"]  # fmt: skip
    for name in index["facts"]:
        assert (saved / "facts" / name).read_bytes() == (facts / name).read_bytes()
    again = reconcile(
        clone, "-i", "lab", "audit", "--format", "json", "--from-snapshot", str(saved)
    )
    _check(again, 2)
    assert _verdicts(again.stdout) == _verdicts(first.stdout)
    # Without its facts the same snapshot is judged as before this change: the inventory's
    # .lab/ files are missing, a located error (exit 1), still no traceback.
    shutil.rmtree(saved / "facts")
    old = reconcile(clone, "-i", "lab", "audit", "--from-snapshot", str(saved))
    assert old.returncode == 1 and "Traceback" not in old.stderr
    assert "image_overlay" in old.stderr and "does not exist" in old.stderr


def test_a_drift_snapshot_carries_its_facts_too(clone, tmp_path):
    """The incidents example judged with its facts, saved, and replayed from a copy of the
    example without its facts/: the same differences, from the facts the snapshot carries."""
    saved = tmp_path / "saved"
    first = reconcile(clone, "--root", "examples/lab-incidents", "-i", "lab", "drift",
                      "--format", "json", "--from-snapshot", "examples/lab-incidents/snapshot",
                      "--save-snapshot", str(saved))  # fmt: skip
    _check(first, 2)
    example = tmp_path / "example"
    shutil.copytree(clone / "examples/lab-incidents", example)
    assert (saved / "facts/images.yaml").read_bytes() == (
        example / "facts/images.yaml"
    ).read_bytes()
    shutil.rmtree(example / "facts")
    again = reconcile(clone, "--root", str(example), "-i", "lab", "drift", "--format", "json",
                      "--from-snapshot", str(saved))  # fmt: skip
    _check(again, 2)
    assert _drifts(again.stdout) == _drifts(first.stdout)
    assert len(_drifts(first.stdout)) > 10


def _verdicts(text: str) -> tuple[dict[str, str], str]:
    doc = json.loads(text)
    return {b["box"]: b["verdict"] for b in doc["boxes"]}, doc["mesh"]["verdict"]


def _drifts(text: str) -> list[tuple[str, ...]]:
    doc = json.loads(text)
    return sorted(
        (box["box"], d["kind"], d["subject"], str(d["path"]), str(d["desired"]), str(d["observed"]))
        for box in doc["boxes"]
        for d in box["drifts"]
    )
