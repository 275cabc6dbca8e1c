"""The mesh side of an observation: what a caller on the network gets from each gateway,
without a key. All gateways and paths at once (a hanging gateway costs one timeout), with httpx
imported only when a command probes. Takes plain base URLs so a drift run can start it before
the desired state is loaded (observe/early.py)."""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from reconciler.scrub import exception_text

PATHS = (("health", "/health"), ("capabilities", "/capabilities"), ("models_noauth", "/v1/models"))


def skip_httpx_cli() -> None:
    """Call before the first `import httpx`: the client without httpx's command-line tool.

    httpx's `__init__` imports its CLI whenever click, rich and pygments are installed (they are
    here), which costs a tenth of a drift run's CPU for code no command uses. A None entry in
    sys.modules makes that one import raise ImportError, the case httpx handles by design (its
    `main` then says how to install the CLI); the client API is untouched.
    """
    if "httpx" not in sys.modules and "httpx._main" not in sys.modules:
        sys.modules["httpx._main"] = None  # type: ignore[assignment]  # None: "not importable"


def needs_tls(urls: list[str]) -> bool:
    """httpx's `verify` for a client that will fetch these URLs. With only plain-HTTP URLs
    there is nothing to verify, and building the default SSL context (CA bundle and all)
    would cost a probe run 30-60 ms of CPU; any https URL keeps full verification."""
    return any(url.lower().startswith("https:") for url in urls)


def probe_gateways(bases: dict[str, str]) -> dict[str, dict[str, Any]]:
    """{box: base URL} -> {box: {"base", "health", "capabilities", "models_noauth"}}."""
    skip_httpx_cli()
    import httpx

    timeout = httpx.Timeout(3.0, connect=2.0)
    verify = needs_tls(list(bases.values()))
    out: dict[str, dict[str, Any]] = {box: {"base": base} for box, base in bases.items()}
    jobs = [(box, probe, base + path) for box, base in bases.items() for probe, path in PATHS]
    if not jobs:
        return out
    with (
        httpx.Client(timeout=timeout, trust_env=False, verify=verify) as client,
        ThreadPoolExecutor(max_workers=len(jobs)) as pool,
    ):
        futures = [
            (box, probe, pool.submit(_get, client, url, probe != "models_noauth"))
            for box, probe, url in jobs
        ]
        for box, probe, future in futures:
            out[box][probe] = future.result()
    return out


def _get(client: Any, url: str, keep_body: bool) -> dict[str, Any]:
    import httpx

    started = time.monotonic()
    try:
        resp = client.get(url)
    except httpx.HTTPError as exc:
        return {"status": None, "error": exception_text(exc)}
    elapsed_ms = int((time.monotonic() - started) * 1000)
    result: dict[str, Any] = {"status": resp.status_code, "ms": elapsed_ms}
    if keep_body:
        try:
            result["body"] = resp.json()
        except ValueError:
            result["body"] = None
    return result
