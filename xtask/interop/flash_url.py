"""Upstream's Python client (env()) flashing from a URL on our exporter: QemuFlasherClient
passes an http:// image as a presigned GET (it never opens it), our exporter fetches it
from a local web server (Python's http.server, with a redirect); the image is dumped back
and compared. Then upstream's OpendalClient reads the same server through our Opendal
driver with `scheme: http`. Used by `cargo xtask interop`.

Usage: flash_url.py PORT DIR NAME   (serves DIR on 127.0.0.1:PORT; NAME is the image)
"""
import functools
import hashlib
import http.server
import os
import sys
import tempfile
import threading
from urllib.parse import quote

from jumpstarter.utils.env import env

port, root, name = int(sys.argv[1]), sys.argv[2], sys.argv[3]
seen = []


class Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        seen.append(("GET", self.path))
        if self.path == "/latest":
            self.send_response(302)
            self.send_header("Location", "/" + quote(name))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        super().do_GET()

    def do_HEAD(self):
        seen.append(("HEAD", self.path))
        super().do_HEAD()


server = http.server.ThreadingHTTPServer(
    ("127.0.0.1", port), functools.partial(Handler, directory=root)
)
threading.Thread(target=server.serve_forever, daemon=True).start()
base = f"http://127.0.0.1:{port}"
with open(os.path.join(root, name), "rb") as f:
    image = f.read()

with env() as client, tempfile.TemporaryDirectory() as tmp:
    board = client.board
    assert type(board.flasher).__name__ == "QemuFlasherClient", type(board.flasher)
    board.flasher.flash(f"{base}/latest")
    back = os.path.join(tmp, "back.img")
    board.flasher.dump(back)
    with open(back, "rb") as f:
        assert f.read() == image, "the image flashed from a URL differs"
    assert ("GET", "/latest") in seen and ("GET", "/" + quote(name)) in seen, seen
    board.flasher.flash(f"{base}/{quote(name)}", target="bios")
    board.flasher.dump(back, target="bios")
    with open(back, "rb") as f:
        assert f.read() == image, "the bios image flashed from a URL differs"
    try:
        board.flasher.flash(f"{base}/missing.img")
    except Exception as e:  # the exporter's error, as the client raises it
        assert "404" in str(e), e
    else:
        raise SystemExit("flashing a missing URL succeeded")
    print("flashed from url", flush=True)

    web = client.web
    assert web.exists(name)
    assert not web.exists("missing.img")
    assert web.stat(name).content_length == len(image)
    assert web.hash(name) == hashlib.sha256(image).hexdigest()
    assert web.read_bytes(name) == image
    try:
        web.write_bytes("new.txt", b"x")
    except Exception as e:
        assert "not supported" in str(e), e
    else:
        raise SystemExit("wrote through the read-only http scheme")
    assert not os.path.exists(os.path.join(root, "new.txt"))
print("python flash url ok")
