"""Round-trips a file through the storage mux at JUMPSTARTER_HOST with the upstream Python client.

usage: storage_roundtrip.py SRC DST
Writes SRC to the `storage` driver (StorageMuxClient.write_local_file), reads the medium back
into DST (read_local_file), and checks both have the same sha256. Used by `cargo xtask interop`.
"""
import hashlib
import sys

from jumpstarter.utils.env import env


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


src, dst = sys.argv[1], sys.argv[2]
with env() as client:
    storage = client.storage
    assert type(storage).__name__ == "StorageMuxClient", type(storage)
    storage.host()
    storage.write_local_file(src)
    storage.read_local_file(dst)
    storage.dut()
want, got = sha256(src), sha256(dst)
assert want == got, f"round trip changed the data: {want} != {got}"
print("python storage round trip ok:", got)
