"""Drives a serial console and a TCP network with the upstream Python client (env()):
PySerialClient.pexpect() logs into the pty board, TcpPortforwardAdapter reaches the
board's echo server. Used by `cargo xtask interop`.
"""
import socket

from jumpstarter.utils.env import env
from jumpstarter_driver_network.adapters import TcpPortforwardAdapter

with env() as client:
    assert type(client.serial).__name__ == "PySerialClient", type(client.serial)
    assert type(client.net).__name__ == "NetworkClient", type(client.net)
    with client.serial.pexpect() as p:
        p.sendline("")
        p.expect("login: ", timeout=30)
        p.sendline("root")
        p.expect("root@board:~# ", timeout=30)
        p.sendline("echo interop-ok")
        p.expect("interop-ok", timeout=30)
    with TcpPortforwardAdapter(client=client.net) as addr:
        with socket.create_connection(addr) as s:
            s.sendall(b"through the forward")
            got = b""
            while len(got) < len(b"through the forward"):
                chunk = s.recv(1024)
                assert chunk, "connection closed early"
                got += chunk
            assert got == b"through the forward", got
    print("address:", client.net.address())
    print("python console ok")
