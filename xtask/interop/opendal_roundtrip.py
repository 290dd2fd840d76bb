"""Round-trips a file through the Opendal(fs) driver at JUMPSTARTER_HOST with the upstream client.

usage: opendal_roundtrip.py SRC DST
Writes SRC to `image.bin` on the `opendal` driver (OpendalClient.write_from_path), checks the
exporter's view of it (exists, stat, sha256 computed by the exporter), reads it back into DST
(read_into_path), and checks both local files have the same sha256. Then asks for a path outside
the storage root and expects a refusal. Used by `cargo xtask interop`.
"""
import hashlib
import os
import sys

from jumpstarter.utils.env import env


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


src, dst = sys.argv[1], sys.argv[2]
want = sha256(src)
with env() as client:
    opendal = client.opendal
    assert type(opendal).__name__ == "OpendalClient", type(opendal)
    assert not opendal.exists("image.bin"), "image.bin exists before the upload"
    opendal.write_from_path("image.bin", src)
    assert opendal.exists("image.bin"), "image.bin missing after the upload"
    size = opendal.stat("image.bin").content_length
    assert size == os.path.getsize(src), f"stat says {size} bytes"
    remote = opendal.hash("image.bin", "sha256")
    assert remote == want, f"exporter hash {remote} != {want}"
    opendal.read_into_path("image.bin", dst)
    try:
        opendal.stat("../outside.bin")
    except Exception as e:  # the exporter's refusal arrives as a driver error
        print("outside the root refused:", type(e).__name__)
    else:
        raise AssertionError("a path outside the storage root was accepted")
got = sha256(dst)
assert want == got, f"round trip changed the data: {want} != {got}"
print("python opendal round trip ok:", got)
