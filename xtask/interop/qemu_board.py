"""Drives the QEMU test board with the upstream Python client (env()): QemuClient's flasher
writes the image, power on, PySerialClient.pexpect() waits for the shell prompt on the
console, runs a command and checks its output, power off. Used by `cargo xtask interop`.

Usage: qemu_board.py IMAGE
"""
import base64
import os
import socket
import sys
import time
import urllib.parse

import pexpect

from jumpstarter.utils.env import env

image = sys.argv[1]


def ws_first_message(host, port):
    """Opens a WebSocket to host:port by hand (as a browser's noVNC page would) and returns
    the payload of the first message the server sends."""
    with socket.create_connection((host, port), timeout=30) as s:
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall((f"GET /websockify HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                   f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                   "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        f = s.makefile("rb")
        status = f.readline()
        assert b" 101 " in status, status
        while f.readline() not in (b"\r\n", b""):
            pass
        head = f.read(2)
        assert head[0] & 0x0F == 2, f"not a binary frame: {head!r}"
        n = head[1] & 0x7F
        if n == 126:
            n = int.from_bytes(f.read(2), "big")
        elif n == 127:
            n = int.from_bytes(f.read(8), "big")
        return f.read(n)


with env() as client:
    board = client.board
    assert type(board).__name__ == "QemuClient", type(board)
    assert type(board.console).__name__ == "PySerialClient", type(board.console)
    board.flasher.flash(image)
    print("flashed", flush=True)
    started = time.monotonic()
    board.power.on()
    try:
        # The boot takes a while under TCG: poke the shell until its prompt shows. A console
        # connection that stops delivering (seen once in CI) gets one fresh connection.
        for attempt, pokes in ((1, 25), (2, 15)):
            with board.console.pexpect() as p:
                for _ in range(pokes):
                    p.sendline("")
                    try:
                        p.expect("board# ", timeout=6)
                        break
                    except pexpect.TIMEOUT:
                        continue
                else:
                    seen = p.before[-400:] if isinstance(p.before, bytes) else b""
                    print(f"no prompt on console connection {attempt}; last read: {seen!r}",
                          file=sys.stderr, flush=True)
                    continue
                print(f"prompt after {time.monotonic() - started:.1f} s", flush=True)
                break
        else:
            raise SystemExit("no shell prompt on the console")
        with board.console.pexpect() as p:
            p.sendline("echo kernel=$(uname -s) sum=$((6*7))")
            # Up to the line's end: the output may arrive in pieces, and `\d+` alone would
            # match a number cut short ("4" of "42").
            p.expect(rb"kernel=(\S+) sum=(\d+)\r?\n", timeout=30)
            got = (p.match.group(1), p.match.group(2))
            assert got == (b"Linux", b"42"), got
        # QemuClient.novnc(): upstream's noVNC adapter, through our exporter's vnc child,
        # reaches QEMU's VNC server, which speaks first (RFB's version banner).
        with board.novnc() as url:
            query = urllib.parse.parse_qs(urllib.parse.urlparse(url).query)
            banner = ws_first_message(query["host"][0], int(query["port"][0]))
            assert banner.startswith(b"RFB 003."), banner
        print("novnc ok", flush=True)
    finally:
        board.power.off()
    print("python qemu ok")
