"""Drives the QEMU test board with the upstream Python client (env()): QemuClient's flasher
writes the image, power on, PySerialClient.pexpect() waits for the shell prompt on the
console, runs a command and checks its output, power off. Used by `cargo xtask interop`.

Usage: qemu_board.py IMAGE
"""
import sys
import time

import pexpect

from jumpstarter.utils.env import env

image = sys.argv[1]

with env() as client:
    board = client.board
    assert type(board).__name__ == "QemuClient", type(board)
    assert type(board.console).__name__ == "PySerialClient", type(board.console)
    board.flasher.flash(image)
    print("flashed", flush=True)
    started = time.monotonic()
    board.power.on()
    try:
        with board.console.pexpect() as p:
            # The boot takes a while under TCG: poke the shell until its prompt shows.
            for _ in range(40):
                p.sendline("")
                try:
                    p.expect("board# ", timeout=6)
                    break
                except pexpect.TIMEOUT:
                    continue
            else:
                raise SystemExit("no shell prompt on the console")
            print(f"prompt after {time.monotonic() - started:.1f} s", flush=True)
            p.sendline("echo kernel=$(uname -s) sum=$((6*7))")
            # Up to the line's end: the output may arrive in pieces, and `\d+` alone would
            # match a number cut short ("4" of "42").
            p.expect(rb"kernel=(\S+) sum=(\d+)\r?\n", timeout=30)
            got = (p.match.group(1), p.match.group(2))
            assert got == (b"Linux", b"42"), got
    finally:
        board.power.off()
    print("python qemu ok")
