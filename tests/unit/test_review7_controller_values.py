"""Proposed with reconciler/observe/controller_secrets.py's patch (review 7, defect 1): a
controller_env secret no `.env` line can hold stops drift, apply --dry and the pyinfra deploys
before any box is contacted, naming the variable, never the value."""

from __future__ import annotations

import pytest

from reconciler.observe.controller_secrets import MissingControllerSecret, controller_values

PAYLOAD = {"controller_secrets": {"mesh_key": "FLEET_MESH_KEY"}}


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("mesh-key-0451\r", "a carriage return"),
        ("mesh-key\x000451", "NUL"),
        ("it's-$HOME-0451", "both ' and $"),
        ("mesh-key-0451\\", "odd number of backslashes"),
    ],
)
def test_a_controller_secret_no_env_line_can_hold_stops_the_run(value: str, said: str) -> None:
    with pytest.raises(MissingControllerSecret) as caught:
        controller_values({"thor": PAYLOAD, "orin": PAYLOAD}, {"FLEET_MESH_KEY": value})
    message = str(caught.value)
    assert message.startswith("secret mesh_key: $FLEET_MESH_KEY cannot be written to .env: ")
    assert said in message and "(needed to check thor, orin); no box was contacted" in message
    assert "0451" not in message
    good = controller_values({"thor": PAYLOAD}, {"FLEET_MESH_KEY": "mesh-key-0451"})
    assert good == {"thor": {"mesh_key": "mesh-key-0451"}}
