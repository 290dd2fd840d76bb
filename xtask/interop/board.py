"""A simulated board for `cargo xtask interop`: a pseudo-terminal whose device side is
linked at LINK (as /dev/serial/by-id names a USB adapter), answering a login prompt and a
tiny shell, plus a TCP echo server on 127.0.0.1 (the board's network).

usage: board.py LINK   (prints "echo port N" and "board ready" on stderr; stops on SIGTERM)
"""
import os
import select
import signal
import socket
import sys
import threading

link = sys.argv[1]
master, slave = os.openpty()  # the slave stays open: the master never reads EIO
try:
    os.unlink(link)
except FileNotFoundError:
    pass
os.symlink(os.ttyname(slave), link)


def echo_server(listener):
    while True:
        conn, _ = listener.accept()

        def serve(c):
            with c:
                while data := c.recv(65536):
                    c.sendall(data)

        threading.Thread(target=serve, args=(conn,), daemon=True).start()


listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen()
threading.Thread(target=echo_server, args=(listener,), daemon=True).start()
print(f"echo port {listener.getsockname()[1]}", file=sys.stderr, flush=True)

signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("board ready", file=sys.stderr, flush=True)
logged_in = False
line = b""
while True:
    select.select([master], [], [])
    data = os.read(master, 1024)
    for b in data:
        if b not in (10, 13):
            line += bytes([b])
            continue
        cmd = line.decode(errors="replace")
        line = b""
        if not logged_in:
            if cmd == "root":
                logged_in = True
                reply = "\r\nWelcome to the board\r\nroot@board:~# "
            else:
                reply = "\r\nboard login: "
        elif cmd.startswith("echo "):
            reply = cmd[5:] + "\r\nroot@board:~# "
        else:
            reply = cmd + ": command not found\r\nroot@board:~# "
        os.write(master, reply.encode())
