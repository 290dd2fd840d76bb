"""Holds one connection to an exporter over a lease that ends, with the upstream Python client.

Usage: lease_end_raw_client.py CLIENT_CONFIG SELECTOR MARKER

Leases SELECTOR for 3 s and calls `power.on()`; once MARKER exists (the exporter's afterLease
hook writes it after the lease ended), calls `power.off()` over the same connection, which the
exporter must refuse. Used by `cargo xtask interop`.
"""
import os
import sys
import time
from datetime import timedelta

from jumpstarter.config.client import ClientConfigV1Alpha1

config = ClientConfigV1Alpha1.from_file(sys.argv[1])
marker = sys.argv[3]
with config.lease(selector=sys.argv[2], duration=timedelta(seconds=3)) as lease:
    with lease.connect() as client:
        client.power.on()
        print("driver call during the lease: ok", flush=True)
        for _ in range(600):
            if os.path.exists(marker):
                break
            time.sleep(0.1)
        else:
            sys.exit("the afterLease hook never started")
        try:
            client.power.off()
        except Exception as e:  # noqa: BLE001 - any refusal will do; its text is checked
            print(f"driver call after the lease ended: refused: {e}", flush=True)
        else:
            sys.exit("a driver call after the lease ended was served")
