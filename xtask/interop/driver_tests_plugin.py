"""A pytest plugin that runs upstream's driver tests against OUR exporter.

Upstream's driver packages ship their tests (``jumpstarter_driver_*/*_test.py``); they build a
driver object and call ``jumpstarter.common.utils.serve(driver)`` for a client connected to an
in-process Python exporter. This plugin replaces ``serve`` (and ``serve_async``) so that the
driver is served by our ``jmp run`` instead: the driver's type (``module.Class``) and the
arguments the test constructed it with become an exporter config entry (our exporter maps the
type to its Rust driver, or hosts upstream's Python driver in its bridge), ``jmp run`` listens
on a loopback port, and upstream's client connects to it and gets that driver.

A driver built with something a config cannot say (a live Python object) is "not
expressible": its test is reported as skipped with a reason starting ``not expressible:`` and
listed as such, never passed.

Settings (environment):
    JMP_DRIVER_TESTS_JMP     our ``jmp`` (required unless the mode is ``upstream``)
    JMP_DRIVER_TESTS_MODE    ``ours`` (default) or ``upstream`` (upstream's own ``serve``,
                             untouched: to check a known upstream failure fails there too)
    JMP_DRIVER_TESTS_REPORT  a JSON file to write each test's outcome to
    JMP_DRIVER_TESTS_LOGS    a directory for the exporters' logs (default: a temp dir)

Load it with ``-p driver_tests_plugin`` (its directory on ``PYTHONPATH``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePath

import pytest
import yaml
from anyio.from_thread import start_blocking_portal

import jumpstarter.common.utils as upstream_utils
from jumpstarter.client import client_from_path
from jumpstarter.driver import Driver

MODE = os.environ.get("JMP_DRIVER_TESTS_MODE", "ours")
# The name the driver under test has in the exporter config (its client is that child).
CHILD = "driver"
# How long our exporter may take to listen, and to stop.
START_TIMEOUT = 60
STOP_TIMEOUT = 30
LISTENING = re.compile(r"listening on (\S+)")


class NotExpressible(Exception):
    """The driver under test cannot be written as an exporter config entry."""


@dataclass
class TestRecord:
    """What happened to one test."""

    outcome: str = "passed"
    # How many drivers the test had served by our exporter.
    served: int = 0
    reason: str = ""
    # The exporters' log files, shown when the test fails.
    logs: list[str] = field(default_factory=list)


CURRENT: TestRecord | None = None
RECORDS: dict[str, TestRecord] = {}


# --- the arguments a driver was built with ----------------------------------------------------

# Upstream's drivers are dataclasses: the arguments a test passed are the config entry. A
# value that equals its field's default cannot tell "passed" from "defaulted", and a
# default_factory's live object (a temp dir) is the driver's own: record the keyword arguments
# themselves as each driver is constructed.
_original_new = Driver.__new__


def _recording_new(cls, *args, **kwargs):
    obj = _original_new(cls) if _original_new is object.__new__ else _original_new(cls, *args, **kwargs)
    object.__setattr__(obj, "_driver_tests_args", (args, dict(kwargs)))
    return obj


PLAIN = (str, int, float, bool, type(None))
PROXY = "jumpstarter_driver_composite.driver.Proxy"


def _plain(value, where: str):
    """`value` as YAML data, or NotExpressible naming `where`."""
    if isinstance(value, PLAIN):
        return value
    if isinstance(value, PurePath):
        # A config gives a path as its text.
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise NotExpressible(f"{where} has a key of type {type(k).__name__}")
            out[k] = _plain(v, f"{where}[{k!r}]")
        return out
    raise NotExpressible(f"{where} is a {type(value).__module__}.{type(value).__qualname__}")


def config_entry(driver: Driver, name: str = CHILD) -> dict:
    """The exporter config entry (`type`, `config`, ...) that builds `driver`."""
    cls = type(driver)
    type_name = f"{cls.__module__}.{cls.__qualname__}"
    if type_name == PROXY:
        # A config says `ref: TARGET` for upstream's Proxy; TARGET is a path from the root,
        # which in our config is the entry the driver under test is.
        return {"ref": f"{CHILD}.{_plain(driver.ref, f'{name}: Proxy(ref=...)')}"}
    recorded = getattr(driver, "_driver_tests_args", None)
    if recorded is None:
        raise NotExpressible(f"{name}: {type_name} was built before the plugin could see its arguments")
    args, kwargs = recorded
    if args:
        raise NotExpressible(f"{name}: {type_name} was built with positional arguments")
    entry: dict = {"type": type_name}
    config = {}
    for key, value in kwargs.items():
        where = f"{name}: {type_name}({key}=...)"
        if key == "children":
            entry["children"] = {k: config_entry(v, f"{name}.{k}") for k, v in value.items()}
        elif key in ("description", "methods_description"):
            if value:
                entry[key] = _plain(value, where)
        else:
            config[key] = _plain(value, where)
    if config:
        entry["config"] = config
    return entry


# --- our exporter ---------------------------------------------------------------------------


def _logs_dir() -> Path:
    d = os.environ.get("JMP_DRIVER_TESTS_LOGS")
    if d:
        Path(d).mkdir(parents=True, exist_ok=True)
        return Path(d)
    return Path(tempfile.mkdtemp(prefix="jmp-driver-tests-"))


LOGS = _logs_dir()
_counter = 0


def _die_with_parent() -> list[str]:
    """A prefix for the exporter's command line: SIGTERM to the exporter when pytest dies
    (killed at a timeout, say), so no exporter outlives the run. util-linux's `setpriv`
    sets it just before it runs the exporter; no `preexec_fn`, which would run Python in a
    child forked from a process with gRPC's threads (that child can abort)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []


@contextmanager
def our_exporter(driver: Driver):
    """Runs our `jmp run` serving `driver` on a loopback port; yields its address."""
    global _counter
    try:
        entry = config_entry(driver)
    except NotExpressible as e:
        # Recorded here too: a test may catch the error, or see it wrapped in a group.
        if CURRENT is not None and CURRENT.outcome != "not-expressible":
            CURRENT.outcome = "not-expressible"
            CURRENT.reason = str(e)
        raise
    jmp = os.environ.get("JMP_DRIVER_TESTS_JMP")
    if not jmp:
        raise RuntimeError("JMP_DRIVER_TESTS_JMP (our jmp) is not set")
    _counter += 1
    config_path = LOGS / f"exporter-{os.getpid()}-{_counter}.yaml"
    log_path = LOGS / f"exporter-{os.getpid()}-{_counter}.log"
    config = {
        "apiVersion": "jumpstarter.dev/v1alpha1",
        "kind": "ExporterConfig",
        "metadata": {"namespace": "default", "name": "driver-tests"},
        "endpoint": "",
        "token": "",
        "export": {CHILD: entry},
    }
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = dict(os.environ)
    # Python drivers (types without a Rust driver) run in this interpreter, with its packages.
    env.setdefault("JMP_PYTHON", sys.executable)
    proc = subprocess.Popen(  # noqa: S603 (our own binary, our own arguments)
        [
            *_die_with_parent(),
            jmp,
            "run",
            "--exporter-config",
            str(config_path),
            "--tls-grpc-listener",
            "127.0.0.1:0",
            "--tls-grpc-insecure",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    if CURRENT is not None:
        CURRENT.served += 1
        CURRENT.logs.append(str(log_path))
    address: list[str] = []
    listening = threading.Event()

    def drain():
        # Keeps the pipe empty (the exporter never blocks on its log) and finds the address.
        with open(log_path, "wb") as log:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                if not address:
                    m = LISTENING.search(line.decode("utf-8", "replace"))
                    if m:
                        address.append(m.group(1))
                        listening.set()
        listening.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        listening.wait(START_TIMEOUT)
        if not address:
            raise RuntimeError(
                f"our exporter did not listen (exit code {proc.poll()}):\n{log_path.read_text(errors='replace')}"
            )
        yield address[0]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reader.join(STOP_TIMEOUT)


@asynccontextmanager
async def _client(address: str, portal, stack):
    async with client_from_path(address, portal, stack, allow=[], unsafe=True, insecure=True) as root:
        try:
            yield root.children[CHILD]
        finally:
            if hasattr(root, "close"):
                root.close()


@contextmanager
def serve(root_device: Driver):
    """Upstream's `serve`, with the driver served by our exporter."""
    with our_exporter(root_device) as address:
        with start_blocking_portal() as portal:
            with ExitStack() as stack:
                with portal.wrap_async_context_manager(_client(address, portal, stack)) as client:
                    try:
                        yield client
                    finally:
                        if hasattr(client, "close"):
                            client.close()


@asynccontextmanager
async def serve_async(root_device: Driver, portal, stack: ExitStack):
    """Upstream's `serve_async`, with the driver served by our exporter."""
    with our_exporter(root_device) as address:
        async with _client(address, portal, stack) as client:
            try:
                yield client
            finally:
                if hasattr(client, "close"):
                    client.close()


if MODE == "ours":
    Driver.__new__ = staticmethod(_recording_new)
    upstream_utils.serve = serve
    upstream_utils.serve_async = serve_async
elif MODE != "upstream":
    raise RuntimeError(f"JMP_DRIVER_TESTS_MODE must be 'ours' or 'upstream', not {MODE!r}")


# --- pytest hooks ---------------------------------------------------------------------------


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global CURRENT
    CURRENT = RECORDS.setdefault(item.nodeid, TestRecord())
    try:
        yield
    finally:
        CURRENT = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    record = RECORDS.setdefault(item.nodeid, TestRecord())
    if record.outcome == "not-expressible":
        # Whatever the test made of the error (it may have caught it, or failed on the
        # group that wrapped it), it did not run against our exporter: never a pass.
        if report.when == "call" or report.failed:
            report.outcome = "skipped"
            report.longrepr = (str(item.path), item.location[1] or 0, f"not expressible: {record.reason}")
        return
    if report.failed:
        record.outcome = "failed"
        record.reason = (call.excinfo.exconly() if call.excinfo else report.longreprtext)[-2000:]
        for path in record.logs:
            try:
                text = Path(path).read_text(errors="replace")[-4000:]
            except OSError as e:
                text = f"(cannot read: {e})"
            report.sections.append((f"our exporter log {path}", text))
    elif report.skipped and record.outcome == "passed":
        record.outcome = "skipped"
        if isinstance(report.longrepr, tuple):
            record.reason = str(report.longrepr[2])


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("JMP_DRIVER_TESTS_REPORT")
    if not path:
        return
    data = {
        nodeid: {"outcome": r.outcome, "served": r.served, "reason": r.reason} for nodeid, r in RECORDS.items()
    }
    Path(path).write_text(json.dumps(data, indent=1))
