"""Connects to a forwarded TCP address and checks that a message comes back (the board's
echo server is at the other end). Used by `cargo xtask interop`.

usage: forward_check.py HOST:PORT MESSAGE   (prints "forward ok")
"""
import socket
import sys

host, port = sys.argv[1].strip().rsplit(":", 1)
msg = sys.argv[2].encode()
with socket.create_connection((host, int(port)), timeout=30) as s:
    s.sendall(msg)
    got = b""
    while len(got) < len(msg):
        chunk = s.recv(1024)
        assert chunk, "connection closed early"
        got += chunk
    assert got == msg, got
print("forward ok")
