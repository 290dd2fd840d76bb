"""Upstream's Python client for the example Rust driver `Chamber`.

The driver reports `jumpstarter_example_chamber.client.ChamberClient` as its client class;
with this directory on PYTHONPATH (or the package installed), upstream's `jumpstarter`
client imports this class for it: scripts call its methods, and upstream's `j` offers
its `cli()` commands.
"""

from collections.abc import Generator

import click
from jumpstarter.client import DriverClient
from jumpstarter.client.decorators import driver_click_group


class ChamberClient(DriverClient):
    def set_target(self, celsius: float) -> float:
        """Set the target temperature (°C); return the previous one."""
        return self.call("set_target", celsius)

    def target(self) -> float:
        """The target temperature, °C."""
        return self.call("target")

    def info(self) -> dict:
        """Label, sensors and allowed range."""
        return self.call("info")

    def read(self, count: int = 1) -> Generator[dict, None, None]:
        """`count` rounds of readings ({"sensor": N, "celsius": T}), one per sensor each."""
        yield from self.streamingcall("read", count)

    def ask(self, line: str) -> str:
        """Send one line to the chamber's console; return its answer."""
        if "\n" in line:
            raise ValueError("a console line cannot contain a newline")
        with self.stream("console") as s:
            s.send(line.encode() + b"\n")
            answer = b""
            while not answer.endswith(b"\n"):
                answer += s.receive()
        return answer.decode().rstrip("\n")

    def cli(self):
        @driver_click_group(self)
        def base():
            """Climate chamber"""

        @base.command()
        @click.argument("celsius", type=float, required=False)
        def target(celsius):
            """Print the target temperature, or set it"""
            if celsius is None:
                click.echo(self.target())
            else:
                previous = self.set_target(celsius)
                click.echo(f"Target {previous} -> {celsius} °C", err=True)

        @base.command()
        @click.option("--count", "-n", default=1, help="Rounds of readings")
        def read(count):
            """Print sensor readings"""
            for r in self.read(count):
                click.echo(f"sensor={int(r['sensor'])} celsius={float(r['celsius'])!r}")

        @base.command()
        @click.argument("line")
        def ask(line):
            """Send one line to the chamber's console and print its answer"""
            click.echo(self.ask(line))

        return base
