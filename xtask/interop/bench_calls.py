"""Unary driver-call latency with the upstream Python client: power.on N times.

usage: JUMPSTARTER_HOST=... bench_calls.py CALLS  -> one JSON line like bench_calls.rs
"""
import json
import sys
import time

from jumpstarter.utils.env import env

calls = int(sys.argv[1]) if len(sys.argv) > 1 else 500
with env() as client:
    for _ in range(50):
        client.power.on()
    lat = []
    start = time.perf_counter()
    for _ in range(calls):
        t = time.perf_counter()
        client.power.on()
        lat.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - start
lat.sort()


def pct(p):
    return lat[round((len(lat) - 1) * p)] * 1e6


print(json.dumps({"p50_us": round(pct(0.5), 1), "p99_us": round(pct(0.99), 1), "calls_per_sec": round(calls / elapsed)}))
