"""Gives an exporter config written by `jmp admin create exporter --out` its drivers.

Usage: python set_export.py EXPORTER_CONFIG
"""

import sys

import yaml

path = sys.argv[1]
with open(path) as f:
    config = yaml.safe_load(f)
config["export"] = {
    "power": {"type": "jumpstarter_driver_power.driver.MockPower"},
}
with open(path, "w") as f:
    yaml.safe_dump(config, f)
print("export set")
