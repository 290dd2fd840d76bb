# The Python driver host of the Rust exporter (jumpstarter-cli/src/bridge).
#
# Started by the exporter with one JSON line on stdin:
#   {"socket": PATH, "subtrees": [{"key": K, "instance": {...}, "uuids": {PATH: UUID},
#                                  "rust_types": [TYPE...]}]}
# A descendant whose type is among its subtree's `rust_types` (a Rust driver provides it) and
# that Python cannot import is left out of the Python tree: the exporter builds it in Rust
# and hangs it under its Python parent itself. Those descendants' paths come back in the
# answer, `"rust": {K: [[NAME...]...]}`.
# or, to check an exporter config without building anything (`jmp config exporter edit`):
#   {"check": true, "subtrees": [...]}  -> imports the types, answers {"checked": true}, exits
# It builds each subtree with upstream's own runtime (the `export` entry model of
# jumpstarter.config.exporter), serves them under one root on a Unix socket with
# upstream's Session, and answers with one JSON line on stdout:
#   {"ready": PATH, "rust": {...}}   serving
#   {"error": {...}}           could not (kind, type, message, traceback); exit code 3
# It exits when stdin reaches its end: the exporter died or let go of it.
#
# Once serving, stdout carries only this protocol: the drivers' log records, one JSON line
# each, {"log": [LEVEL, DRIVER, MESSAGE]} (DRIVER: whether upstream's session would send it
# to clients as a driver's log). What drivers print goes to stderr instead. The exporter
# relays those records into its own LogStream; a pipe write per record costs the child far
# less than upstream's LogStream (a gRPC message per record from a 50 ms poll loop), and
# the child serves calls on the same thread.
import gc
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback


# The protocol's end of stdout; sys.stdout becomes stderr (see protocol()).
_out = sys.stdout


def answer(obj):
    _out.write(json.dumps(obj) + "\n")
    _out.flush()


def protocol():
    """Keeps the original stdout for the protocol and sends prints (sys.stdout, fd 1) to
    stderr, so that nothing a driver prints can be taken for a protocol line."""
    global _out
    fd = os.dup(1)
    os.dup2(2, 1)
    _out = os.fdopen(fd, "w", buffering=1)
    sys.stdout = sys.stderr


class LogRelay(logging.Handler):
    """Writes each log record to the protocol as one line (logging.Handler.handle holds the
    handler's lock around emit, so lines of concurrent threads never interleave)."""

    def __init__(self, is_driver):
        super().__init__()
        self.is_driver = is_driver

    def emit(self, record):
        try:
            line = json.dumps(
                {"log": [record.levelname, self.is_driver(record), record.getMessage()]}
            ) + "\n"
            data = line.encode()  # ASCII: json.dumps escapes the rest
            fd = _out.fileno()
            while data:
                data = data[os.write(fd, data):]
        except Exception:  # noqa: BLE001
            self.handleError(record)


def fail(kind, type_name, message):
    answer({"error": {"kind": kind, "type": type_name, "message": message,
                      "traceback": traceback.format_exc()}})
    sys.stdout.flush()
    sys.exit(3)


def types_of(instance, out):
    t = instance.get("type")
    if t:
        out.append(t)
    for child in (instance.get("children") or {}).values():
        types_of(child, out)
    return out


def main():
    spec = json.loads(sys.stdin.readline())
    try:
        import anyio
        from jumpstarter.common import ExporterStatus
        from jumpstarter.common.importlib import import_class
        from jumpstarter.config.exporter import ExporterConfigV1Alpha1DriverInstance
        from jumpstarter.driver import Driver
        from jumpstarter.exporter.session import Session
    except Exception as e:  # noqa: BLE001
        fail("runtime", None, f"{type(e).__name__}: {e}")

    def importable(t):
        try:
            import_class(t, [], True)
            return True
        except Exception:  # noqa: BLE001
            return False

    def leave_to_rust(instance, rust_types, path, out):
        children = instance.get("children") or {}
        for name in list(children):
            child = children[name]
            t = child.get("type")
            if t and t in rust_types and not importable(t):
                del children[name]
                out.append(path + [name])
            else:
                leave_to_rust(child, rust_types, path + [name], out)
        return out

    rust = {}
    for subtree in spec["subtrees"]:
        rust[subtree["key"]] = leave_to_rust(
            subtree["instance"], set(subtree.get("rust_types") or []), [], [])

    for subtree in spec["subtrees"]:
        for t in types_of(subtree["instance"], []):
            try:
                import_class(t, [], True)
            except Exception as e:  # noqa: BLE001
                cause = e.__cause__ or e
                fail("import", t, f"{type(cause).__name__}: {cause}")
    if spec.get("check"):
        answer({"checked": True})
        return

    class BridgeRoot(Driver):
        """The root the exporter's subtrees hang under (never reported to clients)."""

        @classmethod
        def client(cls):
            return "jumpstarter_driver_composite.client.CompositeClient"

    children = {}
    for subtree in spec["subtrees"]:
        instance = subtree["instance"]
        try:
            driver = ExporterConfigV1Alpha1DriverInstance.model_validate(instance).instantiate()
        except Exception as e:  # noqa: BLE001
            fail("build", instance.get("type"), f"{type(e).__name__}: {e}")
        # After a restart the exporter asks for the uuids its clients already know.
        wanted = subtree.get("uuids") or {}
        if wanted:
            from uuid import UUID

            def walk(d, path):
                if path in wanted:
                    d.uuid = UUID(wanted[path])
                for name, c in d.children.items():
                    walk(c, f"{path}.{name}" if path else name)

            walk(driver, "")
        children[subtree["key"]] = driver
    root = BridgeRoot(children=children)

    def lifeline():
        # The exporter holds the other end of stdin: its end (even after kill -9) ends us.
        try:
            while sys.stdin.buffer.read(65536):
                pass
        finally:
            threading.Thread(target=watchdog, daemon=True).start()
            # Unwind serve(): the session closes the drivers, then main() ends cleanly.
            os.kill(os.getpid(), signal.SIGINT)

    def watchdog():
        # Closing drivers (a flasher removing its medium) can take seconds on a loaded
        # machine. Past a few seconds (well within the exporter's grace period), remove
        # the drivers' temporary directories ourselves, so that neither our kill nor the
        # exporter's leaves their files behind; then wait a while longer for a clean end.
        time.sleep(4)
        remove_temporary_directories()
        time.sleep(11)
        kill_group(signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=lifeline, daemon=True).start()

    async def serve():
        session = Session(root_device=root)
        with session:
            session.update_status(ExporterStatus.LEASE_READY, "Ready for commands")
            async with session.serve_port_async(f"unix://{spec['socket']}"):
                answer({"ready": spec["socket"], "rust": rust})
                relay_logs(session)
                await anyio.sleep_forever()

    try:
        anyio.run(serve)
    except KeyboardInterrupt:  # the SIGINT of lifeline()
        pass
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    finally:
        # What the drivers started goes with us.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        kill_group(signal.SIGTERM)
        # Drivers that keep files in a TemporaryDirectory (upstream's MockFlasher) remove
        # them only in its finalizer. Run those finalizers now, by dropping the tree and
        # collecting it, rather than at interpreter exit: exit first joins the threads the
        # drivers and gRPC left, which can take longer on a loaded machine than the
        # watchdog (or the exporter's grace period) waits, and a kill then leaves the
        # files behind.
        children.clear()
        root = driver = None  # noqa: F841
        gc.collect()
        # And those still referenced from somewhere (a frame, a thread) go too.
        remove_temporary_directories()


def relay_logs(session):
    """Sends the log records to the exporter through the protocol instead of upstream's
    LogStream, and keeps stderr for warnings and errors (the exporter shows its tail when
    the child fails)."""
    root = logging.getLogger()
    upstream = getattr(session, "_logging_handler", None)
    if upstream is not None and hasattr(upstream, "get_source_for_record"):
        from jumpstarter.common import LogSource

        def is_driver(record):
            return upstream.get_source_for_record(record) == LogSource.DRIVER

        # Nobody reads its queue (the exporter does not call the child's LogStream):
        # building a protobuf per record for it would be wasted.
        root.removeHandler(upstream)
    else:

        def is_driver(record):
            return record.name.startswith("driver.")

    for h in root.handlers:
        h.setLevel(logging.WARNING)
    root.addHandler(LogRelay(is_driver))


def remove_temporary_directories():
    """Removes every `tempfile.TemporaryDirectory` still alive in this process (a driver's
    scratch space, such as upstream MockFlasher's medium): the process is ending, and their
    finalizers would otherwise run only at interpreter exit, or never after a kill."""
    import tempfile

    for obj in gc.get_objects():
        if isinstance(obj, tempfile.TemporaryDirectory):
            try:
                obj.cleanup()
            except Exception:  # noqa: BLE001
                pass


def kill_group(sig):
    # Started as a process group leader by the exporter (not when run by hand).
    if os.getpgrp() == os.getpid():
        os.killpg(0, sig)


if __name__ == "__main__":
    protocol()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    main()
