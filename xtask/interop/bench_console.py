"""Console figures with the upstream Python client, as `bench_console console` measures ours.

usage: JUMPSTARTER_HOST=... bench_console.py DRIVER MIB LINES
On DRIVER's `connect` stream (an echoing console): LINES one-line round trips (16 bytes out,
the same 16 back), then MIB MiB written (one thread) and read back (another) at the same time.
Prints one JSON line: {"mib_per_sec":..,"rtt_p50_us":..,"rtt_p99_us":..}.
"""
import json
import sys
import threading
import time

from jumpstarter.utils.env import env

CHUNK = 16 * 1024
LINE = b"0123456789abcde\n"
name, mib, lines = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

with env() as client:
    console = getattr(client, name)
    with console.stream() as s:
        lat = []
        for i in range(lines + 20):
            t = time.perf_counter()
            s.send(LINE)
            got = b""
            while len(got) < len(LINE):
                got += s.receive()
            assert got == LINE, got
            if i >= 20:
                lat.append(time.perf_counter() - t)
        total = mib << 20
        chunk = b"x" * CHUNK

        def writer():
            left = total
            while left > 0:
                n = min(left, CHUNK)
                s.send(chunk[:n])
                left -= n

        start = time.perf_counter()
        w = threading.Thread(target=writer)
        w.start()
        got = 0
        while got < total:
            got += len(s.receive())
        elapsed = time.perf_counter() - start
        w.join()
lat.sort()


def pct(p):
    return lat[round((len(lat) - 1) * p)] * 1e6


print(json.dumps({"mib_per_sec": round(mib / elapsed, 2), "rtt_p50_us": round(pct(0.5), 1), "rtt_p99_us": round(pct(0.99), 1)}))
