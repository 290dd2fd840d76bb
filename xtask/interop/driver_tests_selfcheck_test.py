"""The driver-tests plugin checked on itself (run by `cargo xtask interop "driver tests"`,
which expects exactly these outcomes): a driver built with a live object is not expressible,
even when the test catches the error; a wrong answer from our exporter fails; a right one
passes, served by our exporter."""

from jumpstarter.common.utils import serve
from jumpstarter_driver_shell.driver import Shell


def _output(client, *args):
    return "".join(out for out, _, _ in client.streamingcall("call_method", "echo", {}, *args) if out)


def test_live_object():
    with serve(Shell(methods={"echo": "echo $1"}, cwd=object())):
        pass


def test_live_object_caught():
    try:
        with serve(Shell(methods={"echo": "echo $1"}, cwd=object())):
            pass
    except Exception:
        pass


def test_wrong_answer():
    with serve(Shell(methods={"echo": "echo $1"})) as client:
        assert _output(client, "x") == "y\n"


def test_right_answer():
    with serve(Shell(methods={"echo": "echo $1"})) as client:
        assert _output(client, "x") == "x\n"
