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
#   {"ready": PATH, "rust": {...}, "fast": PATH}   serving ("fast": the socket of the
#                              unary fast path, when the spec named one as "fast_socket")
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
    # lifeline() ends serving with a SIGINT to ourselves. A SIGINT ignored by whoever started
    # the exporter (a background job of a script: `jmp run ... &`) is inherited ignored, and
    # Python then installs no handler for it: the SIGINT would do nothing and the process
    # would linger until the watchdog's kill. We are in our own process group, so a
    # terminal's Ctrl-C never reaches us: take SIGINT back whatever it was.
    signal.signal(signal.SIGINT, signal.default_int_handler)
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
                ready = {"ready": spec["socket"], "rust": rust}
                fast = spec.get("fast_socket")
                fast_server = None
                if fast:
                    fast_server = await serve_fast(session, fast)
                    ready["fast"] = fast
                answer(ready)
                relay_logs(session)
                try:
                    await anyio.sleep_forever()
                finally:
                    if fast_server is not None:
                        fast_server.close()

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


# The fast path for unary calls (see the exporter's bridge/fast.rs). On a second Unix
# socket, each connection carries one call at a time:
#   request:  u32 big-endian length, then a DriverCallRequest (protobuf)
#   answer:   u32 big-endian length, then one kind byte and its body:
#             0  a DriverCallResponse (protobuf)
#             1  an error: u32 big-endian grpc status code, then the details (UTF-8)
#             2  the response was larger than MAX_MESSAGE: u64 big-endian its size
# The call runs upstream's own Session.DriverCall on this (the session's) event loop with a
# context that behaves as grpc.aio's does for it, so that its answers and errors are those
# upstream's gRPC server would give, without grpcio's thread hand-offs. A connection that
# ends cancels its call, as a cancelled gRPC call would.
MAX_MESSAGE = 4 * 1024 * 1024  # grpc's default limit on a received message


class FastAbort(Exception):  # noqa: N818 (as grpc.aio's AbortError, an Exception)
    pass


class FastUsageError(Exception):
    pass


class FastContext:
    """What upstream's DriverCall path uses of grpc.aio's ServicerContext: abort() records
    the first status and raises (a second abort raises a usage error, and the first status
    stands, as in grpc.aio)."""

    __slots__ = ("status",)

    def __init__(self):
        self.status = None

    async def abort(self, code, details="", trailing_metadata=()):
        if self.status is not None:
            raise FastUsageError("Abort already called!")
        self.status = (code.value[0], details or "")
        raise FastAbort()

    def invocation_metadata(self):
        return ()

    def done(self):
        return False

    def cancelled(self):
        return False


async def serve_fast(session, path):
    import asyncio

    from jumpstarter_protocol import jumpstarter_pb2

    loop = asyncio.get_running_loop()
    log = logging.getLogger("grpc._cython.cygrpc")

    class FastCall(asyncio.Protocol):
        def __init__(self):
            self.buf = bytearray()
            self.task = None
            self.transport = None

        def connection_made(self, transport):
            self.transport = transport

        def connection_lost(self, exc):
            if self.task is not None:
                self.task.cancel()

        def refuse(self, why):
            logging.getLogger("jumpstarter.bridge").warning("fast call socket: %s; closing the connection", why)
            self.transport.abort()

        def data_received(self, data):
            self.buf += data
            if len(self.buf) < 4:
                return
            n = int.from_bytes(self.buf[:4], "big")
            if n > MAX_MESSAGE:
                return self.refuse(f"a request of {n} bytes (the limit is {MAX_MESSAGE})")
            if self.task is not None:
                return self.refuse("a request while one is in flight")
            if len(self.buf) < 4 + n:
                return
            if len(self.buf) > 4 + n:
                return self.refuse("more than one request at a time")
            body = bytes(self.buf[4:])
            self.buf.clear()
            self.task = loop.create_task(self.run(body))

        async def run(self, body):
            try:
                request = jumpstarter_pb2.DriverCallRequest.FromString(body)
            except Exception as e:  # noqa: BLE001
                return self.refuse(f"an unreadable request ({e})")
            ctx = FastContext()
            try:
                response = await session.DriverCall(request, ctx)
                if ctx.status is not None:
                    out = None
                else:
                    out = response.SerializeToString()
            except Exception as e:  # noqa: BLE001
                out = None
                # As grpc.aio logs and answers an exception its handler let through (the
                # status of a first abort() stands).
                if not isinstance(e, FastAbort):
                    log.error("Unexpected [%s] raised by servicer method [%s]",
                              type(e).__name__, "/jumpstarter.v1.ExporterService/DriverCall",
                              exc_info=True)
                if ctx.status is None:
                    ctx.status = (2, "Unexpected %s: %s" % (type(e), e))
            if out is None:
                code, details = ctx.status
                detail_bytes = details.encode()[: MAX_MESSAGE - 5]
                frame = b"\x01" + code.to_bytes(4, "big") + detail_bytes
            elif len(out) > MAX_MESSAGE:
                frame = b"\x02" + len(out).to_bytes(8, "big")
            else:
                frame = b"\x00" + out
            self.task = None
            if not self.transport.is_closing():
                self.transport.write(len(frame).to_bytes(4, "big") + frame)

    return await loop.create_unix_server(FastCall, path=path)


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
