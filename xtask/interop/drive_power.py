"""Drives the exporter at JUMPSTARTER_HOST with the upstream Python client (jumpstarter.utils.env).

Used by `cargo xtask interop` to check that the upstream client works against our exporter.
"""
from jumpstarter.utils.env import env

with env() as client:
    labels = {n: c.labels["jumpstarter.dev/client"] for n, c in client.children.items()}
    assert labels["power"] == "jumpstarter_driver_power.client.PowerClient", labels
    assert type(client.power).__name__ == "PowerClient", type(client.power)
    client.power.on()
    client.power.off()
    readings = [(r.voltage, r.current) for r in client.power.read()]
    assert readings == [(0.0, 0.0), (5.0, 2.0)], readings
    print("python client ok:", readings)
