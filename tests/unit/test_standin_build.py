"""The image builder's pure parts: the catalog, the mirror lookup, the inputs hash, and the
cache decision (build, re-tag or nothing) driven through a recording fake docker CLI."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lab.images import build, contexts, rootfs
from lab.images.catalog import CATALOG
from lab.images.dockercli import Docker, DockerError


def test_catalog_names_and_repos() -> None:
    by_name = {spec.name: spec for spec in CATALOG}
    assert set(by_name) == {
        "vllm_nightly", "vllm_nightly_alt", "vllm_nightly_broken", "vllm_gemma4", "gateway"
    }  # fmt: skip
    assert by_name["vllm_nightly_broken"].fail == "never-healthy"
    assert not by_name["vllm_nightly"].fail
    nightly, alt = by_name["vllm_nightly"], by_name["vllm_nightly_alt"]
    assert nightly.repo == alt.repo == "vllm/vllm-openai"
    assert nightly.version != alt.version  # what makes their digests differ
    assert by_name["vllm_gemma4"].repo == "lobes/vllm-gemma4"
    assert by_name["gateway"].repo == "lobes/gateway"
    assert len({(s.repo, s.tag) for s in CATALOG}) == len(CATALOG)


def test_mirror_from_deb822_and_one_line_sources(tmp_path: Path) -> None:
    deb822 = tmp_path / "debian.sources"
    deb822.write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\n\nTypes: deb\nURIs: http://mirror.example/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n"
    )
    other = tmp_path / "node.sources"
    other.write_text("Types: deb\nURIs: https://node.example/x\nSuites: nodistro\n")
    assert rootfs.debian_mirror((other, deb822)) == "http://mirror.example/debian"
    one_line = tmp_path / "sources.list"
    one_line.write_text(
        "# comment\ndeb [arch=amd64] http://one.example/debian/ bookworm main\n"
        "deb http://one.example/debian-security bookworm-security main\n"
    )
    assert rootfs.debian_mirror((one_line,)) == "http://one.example/debian"
    assert rootfs.debian_mirror((tmp_path / "missing",)) == rootfs.FALLBACK_MIRROR


def test_inputs_hash_follows_content_base_and_args(tmp_path: Path) -> None:
    spec = next(s for s in CATALOG if s.name == "vllm_nightly")
    ctx = tmp_path / "ctx"
    args = contexts.prepare(spec, ctx, [])
    first = contexts.inputs_hash(ctx, "base:a", args)
    assert contexts.inputs_hash(ctx, "base:a", args) == first
    assert contexts.inputs_hash(ctx, "base:b", args) != first
    assert contexts.inputs_hash(ctx, "base:a", {"X": "1"}) != first
    info = json.loads((ctx / "build.json").read_text())
    assert info["version"] == spec.version
    (ctx / "build.json").write_text("{}")
    assert contexts.inputs_hash(ctx, "base:a", args) != first
    assert (ctx / "vllm").stat().st_mode & 0o111


@dataclass(frozen=True)
class FakeDocker(Docker):
    """Answers like the CLI from a dict of local images (ref -> inputs label); records calls."""

    images: dict[str, str] = field(default_factory=dict)
    calls: list[tuple[str, ...]] = field(default_factory=list)

    def run(
        self, *args: str, timeout: float = 600, stdin: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        self.calls.append(args)
        images = self.images
        out = ""
        if args[:2] == ("image", "inspect"):
            if args[-1] not in images:
                raise DockerError("No such image")
            out = images[args[-1]] + "\n"
        elif args[:2] == ("image", "ls"):
            wanted = args[-1].split("=", 2)[2]
            out = "\n".join(f"id-{ref}" for ref, label in images.items() if label == wanted)
        elif args[0] == "tag":
            images[args[2]] = images[args[1].removeprefix("id-")]
        elif args[0] == "build":
            images[args[args.index("--tag") + 1]] = args[args.index("--label") + 1].split("=")[1]
        elif args[0] == "push":
            out = f"latest: digest: sha256:{'a' * 64} size: 1\n"
        return subprocess.CompletedProcess(args, 0, out, "")


@pytest.mark.parametrize(
    ("present", "expect"),
    [("none", "build"), ("same-ref", "nothing"), ("other-registry", "tag")],
)
def test_build_one_cache_decision(tmp_path: Path, present: str, expect: str) -> None:
    spec = next(s for s in CATALOG if s.name == "vllm_nightly_alt")
    probe = tmp_path / "probe"
    inputs = contexts.inputs_hash(probe, "base", contexts.prepare(spec, probe, []))
    ref = f"10.77.0.1:5000/{spec.repo}:{spec.tag}"
    images = {
        "none": {},
        "same-ref": {ref: inputs},
        "other-registry": {f"127.0.0.1:5055/{spec.repo}:{spec.tag}": inputs},
    }[present]
    fake = FakeDocker(("docker",), dict(images))
    ref = build._ensure_local(fake, spec, "10.77.0.1:5000", "base", [], tmp_path)
    assert ref == "10.77.0.1:5000/vllm/vllm-openai:nightly-alt"
    got = build._push(fake, spec, "10.77.0.1:5000", ref)
    assert got == f"10.77.0.1:5000/vllm/vllm-openai@sha256:{'a' * 64}"
    assert fake.images[ref] == inputs
    verbs = [call[0] for call in fake.calls]
    assert ("build" in verbs) == (expect == "build")
    assert ("tag" in verbs) == (expect == "tag")
    assert verbs[-1] == "push"


def test_source_fingerprint_is_stable() -> None:
    first = build.source_fingerprint()
    assert first == build.source_fingerprint()
    assert len(first) == 64
