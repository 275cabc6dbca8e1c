"""A URL's password (`HTTPS_PROXY=http://svc:PW@proxy:3128`, `HF_ENDPOINT=https://u:PW@mirror`)
is hashed on the box in a container's environment, a command line and a `.env` line
(collector `_url_passwords`), as a flag's value is: before, it left the box in clear in every
answer (the reports masked it, the wire and an import did not). The user name and the host
stay readable. The controller judges the same place (compare/inline.py `fits`, `_USERINFO`):
a box's mask fits the desired value it was made of, and no edit of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reconciler.compare.inline import fits, may_carry_secret
from reconciler.report.values import _words
from reconciler.scrub import mask_credentials
from tests.unit.conftest import load_box_program
from tests.unit.cpu_bound import cpu_bound

collector = load_box_program("box_collector_url_password", "reconciler/observe/remote/collector.py")
PW = "hunter2-c6-77"
HASHED = '{"secret": "hmac:'
URLS = {
    "proxy": f"http://svc-lobes:{PW}@proxy.corp:3128",
    "mirror-path": f"https://deploy:{PW}@hf-mirror.corp/models?x=1",
    "at-in-password": f"https://deploy:{PW}@x@mirror.corp",  # parsers end it at the last @
    "quoted-in-a-script": f"sh -c 'curl -x \"http://u:{PW}@p:3128\" http://h/'",
    "two": f"http://a:{PW}@h1 http://b:{PW}@h2/x",
    "user-with-at": f"http://me@corp.example:{PW}@proxy.corp:3128",  # urlsplit's password
    "quote-in-password": f"http://svc:{PW}'C@proxy.corp:3128",  # RFC 3986 allows it
    # URLs without a path, one after another (kombu's sentinel brokers, proxy lists): the
    # first one's authority ran to the next one's `/`, and the next one went unread.
    "sentinels": f"sentinel://:{PW}@s1:26379;sentinel://:{PW}@s2:26379",
    "proxy-list": f"http://svc:{PW}@proxy:3128,http://b:{PW}@p2",
}
# A URL that is the value of a secret-named assignment: hashed whole, as before URLs were read
# (one digest; two side by side fit no desired value: a drift that stayed).
ASSIGNED = [
    f"env DB_SECRET_URL=http://svc:{PW}@db:5432 app",
    f'{{"proxy_password": "http://svc:{PW}@proxy"}}',
    f"X_TOKEN: 'http://u:{PW}@h'",
]
KEPT = [
    "http://user@host:8000",  # no password
    "http://host:8000/v1",  # a port, no user info
    "http://u:@host",  # an empty password
    "see a:b@c",  # no URL
]


def _run(directory: str = "/nonexistent") -> object:
    return collector.Run({"directory": directory, "secret_patterns": [], "run_key": "k" * 64})


@pytest.mark.parametrize("name", sorted(URLS))
def test_the_box_hashes_a_urls_password_in_env_argv_and_dotenv(tmp_path: Path, name: str) -> None:
    text = URLS[name]
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    quoted = text.replace("\\", "\\\\").replace('"', '\\"')
    (deploy / ".env").write_text(f'HTTPS_PROXY="{quoted}"\n', encoding="utf-8")
    run = _run(str(deploy))
    envfile, values = collector.envfile_fact(run)
    assert values["HTTPS_PROXY"] == text
    answers = {
        "env": run.mask_env_map({"HTTPS_PROXY": text}),
        "argv": run.mask_argv(["curl", "-x", text]),
        ".env": envfile,
    }
    for place, answer in answers.items():
        shown = json.dumps(answer)
        assert PW not in shown and "hmac:" in shown, (place, shown)
        assert "://" in shown and ("svc-lobes" in shown or name != "proxy"), (place, shown)


@pytest.mark.parametrize("text", KEPT)
def test_a_url_without_a_password_is_kept(text: str) -> None:
    assert _run().mask_words(text) == text
    assert not may_carry_secret(text)


@pytest.mark.parametrize("name", sorted(URLS))
def test_the_reports_show_the_user_and_host_and_mask_the_password(name: str) -> None:
    hashed = _words(_run().mask_words(URLS[name]))
    clear = mask_credentials(URLS[name])  # a snapshot of an older collector
    for shown in (str(hashed), clear):
        assert PW not in shown and "***@" in shown, shown
    assert str(hashed) == clear or name == "at-in-password", (hashed, clear)


@pytest.mark.parametrize("name", sorted(URLS))
def test_the_boxs_mask_fits_its_value_and_no_edit_of_it(name: str) -> None:
    text = URLS[name]
    masked = _run().mask_words(text)
    assert fits(masked, text)
    assert may_carry_secret(text)
    assert not fits(masked, text.replace("@", "@other.", 1) + " ")
    assert not fits(masked, text.replace(":", ":x ", 2))


def test_a_hostile_mask_of_a_url_is_judged_quickly() -> None:
    digest = json.dumps({"secret": "hmac:" + "0" * 64})
    masked = ("http://u:" + digest + "@") * 8
    with cpu_bound(1.0):
        assert not fits(masked, "http://u:" + "@" * 20000 + " ")


@pytest.mark.parametrize("text", ASSIGNED)
def test_a_url_assigned_to_a_secret_name_is_hashed_whole_and_fits(text: str) -> None:
    masked = _run().mask_words(text)
    assert PW not in masked and masked.count(HASHED) == 1, masked
    assert fits(masked, text)
    assert PW not in mask_credentials(text) and PW not in str(_words(text))


def test_a_long_run_before_a_hashed_url_is_judged_quickly() -> None:
    """A box chooses `envfile_desired`: a 64 KB run of scheme characters before its digest
    made the URL test of `fits` try every start (minutes over one replay), and `a.a.a…` did
    the same to the reports' URL mask."""
    digest = json.dumps({"secret": "hmac:" + "0" * 64})
    with cpu_bound(1.0):
        assert not fits("a" * 65000 + digest + "@x", "x")
        assert mask_credentials("a." * 32500 + "://x@") == "a." * 32500 + "://x@"
