"""Drives a mixed exporter (Rust MockPower, upstream's Python Shell and MockFlasher through the
bridge) with the upstream Python client (jumpstarter.utils.env).

usage: bridge_client.py IMAGE DUMP
Powers on and off, runs the shell method `greet` (its output goes to stdout), flashes IMAGE
and dumps the medium back into DUMP. Used by `cargo xtask interop`, which compares the files.
"""
import sys

from jumpstarter.utils.env import env

image, dump = sys.argv[1], sys.argv[2]
with env() as client:
    labels = {n: c.labels["jumpstarter.dev/client"] for n, c in client.children.items()}
    assert labels == {
        "power": "jumpstarter_driver_power.client.PowerClient",
        "sh": "jumpstarter_driver_shell.client.ShellClient",
        "flasher": "jumpstarter_driver_opendal.client.FlasherClient",
    }, labels
    client.power.on()
    client.power.off()
    code = client.sh.greet("python")
    assert code == 0, f"greet exited {code}"
    code = client.sh.fail_with("7")
    assert code == 7, f"fail_with exited {code}, not 7"
    client.flasher.flash(image)
    client.flasher.dump(dump)
    print("python bridge client ok")
