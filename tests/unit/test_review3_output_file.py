"""`-o FILE` and `--metrics FILE` after the third review (/tmp/review/hist_defects.md, the
metrics temp file): a file a killed run left beside the target, under the name this process
would have used before (`.NAME.PID.tmp`, PIDs are reused), no longer fails the write, and the
new file is flushed to disk before it is renamed over the old one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reconciler import output_file


def test_a_leftover_temporary_file_with_this_pid_is_not_in_the_way(tmp_path: Path) -> None:
    target = tmp_path / "fleet_drift.prom"
    target.write_text("old 1\n")
    leftover = tmp_path / f".{target.name}.{os.getpid()}.tmp"
    leftover.write_text("a killed run's half file\n")
    output_file.write_whole(target, ["new 1\n"])
    assert target.read_text() == "new 1\n"
    assert leftover.read_text() == "a killed run's half file\n"  # not ours to remove
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, leftover.name])


def test_the_new_file_is_on_disk_before_it_replaces_the_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "m.prom"
    target.write_text("old 1\n")
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync " + os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def replace(src: str | Path, dst: str | Path) -> None:
        events.append(f"replace {Path(src).name}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    output_file.write_whole(target, ["new 1\n"])
    assert target.read_text() == "new 1\n"
    first, second, *rest = events
    aside = second.removeprefix("replace ")
    assert first == f"fsync {tmp_path / aside}" and aside.startswith(".m.prom.")
    assert rest == [f"fsync {tmp_path}"]  # the rename, in its directory


def test_a_target_name_near_the_file_system_limit_is_written(tmp_path: Path) -> None:
    """-o FILE with a legal 250-byte name (multi-byte characters included): the temporary file
    beside it must fit the 255-byte limit too, or the whole run's output was lost at the end."""
    for name in ("r" * 250, "é" * 125):
        target = tmp_path / name
        output_file.write_whole(target, ["report\n"])
        assert target.read_text() == "report\n"
        assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
        target.unlink()
