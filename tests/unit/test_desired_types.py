"""Issue 10, class 2: the types of values that reach a command line, a path or `.env`.

The curated table (bad_inputs_table.py) shows each refusal at its FILE:LINE:COL through the
loader; this checks each type's edges directly, including what the YAML loader would stop
before the model sees it (a NUL or an ESC in a value) and what must still be accepted."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from reconciler.desired import types
from reconciler.desired.models import EnvValue, InventoryBox
from reconciler.desired.refs import is_digest_ref, is_image_ref

DIGEST = "3fb023cc987cc7c2bca7ca14c1e0aff5ae06bd9431bf07773731ce7e8a682460"


def _ok(kind: Any, value: Any) -> Any:
    return TypeAdapter(kind).validate_python(value, strict=True)


def _refused(kind: Any, value: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        _ok(kind, value)
    return str(caught.value.errors()[0]["msg"])


@pytest.mark.parametrize("value", ["lobes", "fl-thor", "_svc", "a" * 32, "deploy_2"])
def test_user_names_accepted(value: str) -> None:
    assert _ok(types.UserName, value) == value


@pytest.mark.parametrize(
    "value",
    ["-oProxyCommand=x", "Lobes", "1lobes", "lobes$", "a" * 33, "lobes\n", "", "root@h", "a b"],
)
def test_user_names_refused(value: str) -> None:
    assert "is not a POSIX user name" in _refused(types.UserName, value)


@pytest.mark.parametrize(
    "value",
    ["thor.lan", "thor", "10.77.0.11", "fe80::1", "2001:db8::7", "spark.lan.", "x-1.example"],
)
def test_hosts_accepted(value: str) -> None:
    assert _ok(types.Host, value) == value


@pytest.mark.parametrize(
    "value",
    [
        "-oProxyCommand=x",
        "-thor",
        "thor-",
        "10.0.0.011",
        "0x7f.1",
        "1.2.3",
        "999.1.1.1",
        "[fe80::1]",
        "fe80::1%eth0",
        "user@thor",
        "thor:22",
        "ssh://thor",
        "thor lan",
        "thor.lan\n",
        "a" * 64 + ".lan",
        "",
    ],
)
def test_hosts_refused(value: str) -> None:
    assert "is not a host name" in _refused(types.Host, value)


def test_an_ipv6_host_goes_in_brackets_in_urls() -> None:
    assert types.url_host("fe80::1") == "[fe80::1]"
    assert types.url_host("thor.lan") == "thor.lan"


@pytest.mark.parametrize(
    ("value", "normal"),
    [
        ("~/.lobes", "~/.lobes"),
        ("~", "~"),
        ("~/", "~"),
        (".lobes/.secrets.env", "~/.lobes/.secrets.env"),
        ("~//.lobes/./x", "~/.lobes/x"),
        ("~/my dir/x", "~/my dir/x"),
    ],
)
def test_home_paths_are_normalized_to_the_home(value: str, normal: str) -> None:
    assert _ok(types.HomePath, value) == normal


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("/etc/shadow", "is absolute"),
        ("~root/.ssh", "another user's home"),
        ("~/../x", "has a .. component"),
        ("a/../../x", "has a .. component"),
        ("~/x\n", "a line feed"),
        ("~/x\x00", "a NUL byte"),
        ("~/x\r", "a carriage return"),
        ("~/\x1b[2J", "U+001B"),
    ],
)
def test_home_paths_refused(value: str, why: str) -> None:
    assert why in _refused(types.HomePath, value)


@pytest.mark.parametrize("value", ["triton", "a\tb", "'--x={\"a\": 1}'", "", "ünïcode"])
def test_env_values_accepted(value: str) -> None:
    assert _ok(EnvValue, value) == value


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("x\nGATEWAY_API_KEY=y", "a line feed"),
        ("x\r", "a carriage return"),
        ("x\x00", "a NUL byte"),
        ("\x1b]0;title\x07", "U+001B"),
        ("x\x7f", "U+007F"),
    ],
)
def test_env_values_refused_without_echo(value: str, why: str) -> None:
    message = _refused(EnvValue, value)
    assert why in message and "not shown" in message
    assert repr(value) not in message


@pytest.mark.parametrize(
    "value",
    ["Qwen/Qwen3-Embedding-0.6B", "nvidia/Qwen3.6-35B-A3B-NVFP4", "gpt2", "LiquidAI/LFM2.5-1.2B"],
)
def test_model_ids_accepted(value: str) -> None:
    assert _ok(types.ModelId, value) == value


@pytest.mark.parametrize(
    "value",
    ["../x", "/models/x", "a/b/c", "-x", "a--b/c", "a/b\n", "a b", "org/.hidden", "x" * 97],
)
def test_model_ids_refused(value: str) -> None:
    assert "is not a model id" in _refused(types.ModelId, value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("http://10.77.0.11:8000", None),
        ("https://thor.lan", None),
        ("http://[fe80::1]:8000", None),
        ("http://u:p@thor.lan:8000", "credentials"),
        ("http://thor.lan:8000/", "nothing more"),
        ("http://thor.lan:8000?x", "nothing more"),
        ("http://thor.lan,http://evil", "nothing more"),
        ("HTTP://thor.lan", "nothing more"),
        ("ftp://thor.lan", "nothing more"),
        ("http://fe80::1:8000", "nothing more"),
        ("http://[thor.lan]:8000", "nothing more"),
        ("http://[1.2.3.4]:8000", "is not a host name"),
        ("http://-thor:8000", "is not a host name"),
        ("http://thor.lan:0", "not in 1-65535"),
        ("http://thor.lan:8000\n", "a line feed"),
    ],
)
def test_origins(value: str, message: str | None) -> None:
    if message is None:
        assert _ok(types.HttpOrigin, value) == value
    else:
        refused = _refused(types.HttpOrigin, value)
        assert message in refused
        assert "p@" not in refused  # credentials are never echoed


@pytest.mark.parametrize(
    ("ref", "any_ref", "pinned"),
    [
        (f"vllm/vllm-openai@sha256:{DIGEST}", True, True),
        (f"10.77.0.1:5000/vllm/vllm-openai@sha256:{DIGEST}", True, True),
        (f"registry.lan:5000/lobes/gateway:v1@sha256:{DIGEST}", True, True),
        (f"[::1]:5000/a@sha256:{DIGEST}", True, True),
        ("nvcr.io/nvidia/vllm:26.04-py3", True, False),
        ("ubuntu", True, False),
        (f"vllm/vllm-openai@sha256:{DIGEST}\n", False, False),
        (f"-vllm@sha256:{DIGEST}", False, False),
        ("nvcr.io/NVIDIA/vllm:1", False, False),
        ("a//b", False, False),
        ("a:" + "t" * 129, False, False),
        ("a:-tag", False, False),
        ("a b", False, False),
        (f"vllm@sha256:{DIGEST.upper()}", True, False),
    ],
)
def test_docker_reference_grammar(ref: str, any_ref: bool, pinned: bool) -> None:
    assert (is_image_ref(ref), is_digest_ref(ref)) == (any_ref, pinned)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ssh_key", "-oProxyCommand=x"),
        ("ssh_key", "keys/%u"),
        ("ssh_known_hosts_file", "a b"),
        ("ssh_known_hosts_file", 'kh"x'),
        ("ssh_known_hosts_file", "kh#x"),
        ("ssh_key", "k\n"),
    ],
)
def test_ssh_file_paths_refused(field: str, value: str) -> None:
    box = {"ssh_hostname": "thor.lan", "ssh_user": "lobes", field: value}
    with pytest.raises(ValidationError) as caught:
        InventoryBox.model_validate(box)
    assert "is not a plain file path" in str(caught.value.errors()[0]["msg"])


def test_ssh_file_paths_accepted() -> None:
    box = InventoryBox.model_validate(
        {
            "ssh_hostname": "10.77.0.11",
            "ssh_user": "fl-thor",
            "ssh_key": ".lab/ssh/id_ed25519",
            "ssh_known_hosts_file": "~/.ssh/known_hosts",
        }
    )
    assert box.ssh_key == ".lab/ssh/id_ed25519"


@pytest.mark.parametrize(
    ("kind", "good", "bad"),
    [
        (types.ComposeFile, "docker-compose.shape.yml", "../x.yml"),
        (types.ComposeFile, "a.yaml", "-f.yml"),
        (types.VarGlob, "*_MAX_MODEL_LEN", "$(x)"),
        (types.VarGlob, "[A-Z]?_KEY", "A B"),
        (types.Version, "0.91.0", "٠.٩١.٠"),
        (types.Version, "10.0.1", "0.91.0\n"),
        (types.IPv4, "0.0.0.0", "999.1.1.1"),
        (types.IPv4, "127.0.0.1", "0.0.0.0\n"),
        (types.ImageChoice, "vllm_nightly", "--privileged"),
        (types.Text, "no digest is published", "a\x1b[2Jb"),
        (types.ControllerFile, ".lab/overlay/{box}.yaml", "-x"),
    ],
)
def test_other_types(kind: Any, good: str, bad: str) -> None:
    assert _ok(kind, good) == good
    _refused(kind, bad)
