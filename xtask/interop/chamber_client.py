"""Upstream's Python client drives the example Rust driver (examples/custom-driver) through
the client class the example ships (its `python/` directory on PYTHONPATH).

usage: jmp shell ... -- python chamber_client.py   -> prints "python chamber client ok"
"""
from jumpstarter.utils.env import env

with env() as client:
    chamber = client.chamber
    assert type(chamber).__name__ == "ChamberClient", type(chamber)
    assert type(chamber).__module__ == "jumpstarter_example_chamber.client", type(chamber).__module__
    # unary calls, with the config's setpoint and fields
    assert chamber.target() == 20, chamber.target()
    assert chamber.set_target(33.5) == 20
    assert chamber.target() == 33.5
    info = chamber.info()
    assert info == {"label": "interop-chamber", "sensors": 3, "min": -10, "max": 60}, info
    # a server-streaming call
    readings = list(chamber.read(2))
    assert len(readings) == 6, readings
    assert readings[1] == {"sensor": 1, "celsius": 34.5}, readings
    # the byte stream
    assert chamber.ask("TARGET?") == "TARGET 33.5"
    assert chamber.ask("TARGET 21") == "OK 33.5"
    assert chamber.ask("TARGET 900").startswith("ERR target 900")
    # bad input: a clear error, nothing changed
    try:
        chamber.set_target(1000)
    except Exception as e:  # the upstream client raises its DriverError
        assert "outside -10 .. 60" in str(e), e
    else:
        raise AssertionError("set_target(1000) did not fail")
    assert chamber.target() == 21
    # a stock driver beside it
    client.power.on()
print("python chamber client ok")
