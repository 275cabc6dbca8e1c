"""The controller-side probe client: lean to import, verifying TLS whenever there is TLS."""

from __future__ import annotations

import subprocess
import sys

import pytest

from reconciler.observe.probes import needs_tls


@pytest.mark.parametrize(
    ("urls", "verify"),
    [
        (["http://10.77.0.11:8000", "http://spark.lan:8000"], False),
        (["http://thor.lan:8000", "https://spark.lan:8443"], True),
        (["HTTPS://orin.lan"], True),
        ([], False),
    ],
)
def test_tls_is_verified_whenever_any_url_is_https(urls: list[str], verify: bool) -> None:
    assert needs_tls(urls) is verify


def test_httpx_without_its_cli_still_has_its_client() -> None:
    code = (
        "import sys\n"
        "from reconciler.observe.probes import skip_httpx_cli\n"
        "skip_httpx_cli()\n"
        "import httpx\n"
        "assert httpx.Client and httpx.Timeout and httpx.HTTPError\n"
        "print(sorted(m for m in ('click', 'rich', 'pygments') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"  # none of the CLI's dependencies came along
