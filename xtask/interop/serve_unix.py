"""Serves an ExporterConfig with the upstream Python exporter on a fixed Unix socket path.

usage: serve_unix.py CONFIG SOCKET  (stops on SIGTERM/SIGINT)
"""
import signal
import sys
from pathlib import Path

import anyio
from jumpstarter.common import ExporterStatus
from jumpstarter.config.exporter import ExporterConfigV1Alpha1, ExporterConfigV1Alpha1DriverInstance
from jumpstarter.exporter import Session


async def main(config_path: str, socket_path: str) -> None:
    cfg = ExporterConfigV1Alpha1.load_path(Path(config_path))
    root = ExporterConfigV1Alpha1DriverInstance(
        type="jumpstarter_driver_composite.driver.Composite", children=cfg.export
    ).instantiate()
    with Session(root_device=root) as session:
        async with session.serve_port_async(f"unix://{socket_path}"):
            session.update_status(ExporterStatus.LEASE_READY)
            print("serving", socket_path, flush=True)
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    break


anyio.run(main, sys.argv[1], sys.argv[2])
