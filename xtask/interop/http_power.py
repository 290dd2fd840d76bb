"""Upstream's Python client (env() and `j`) driving our HttpPower driver, which calls a local
HTTP "smart plug" (served here, recording what it receives). Used by `cargo xtask interop`.

Usage: http_power.py PORT   (the plug listens on 127.0.0.1:PORT)
"""
import http.server
import json
import subprocess
import sys
import threading

from jumpstarter.utils.env import env

port = int(sys.argv[1])
seen = []


class Plug(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n).decode() if n else ""
        seen.append((self.command, self.path, body, self.headers.get("Authorization")))
        if self.path == "/broken":
            code, text = 500, "boom"
        elif self.path == "/meter":
            code, text = 200, json.dumps({"emeter": {"voltage": 231.5, "current": 0.25}})
        else:
            code, text = 200, "OK"
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = answer
    do_POST = answer


server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Plug)
threading.Thread(target=server.serve_forever, daemon=True).start()
auth = "Basic YWRtaW46c2VjcmV0"  # admin:secret

with env() as client:
    plug = client.plug
    assert type(plug).__name__ == "PowerClient", type(plug)
    plug.on()
    plug.off()
    readings = list(plug.read())
    assert len(readings) == 1, readings
    assert (readings[0].voltage, readings[0].current) == (231.5, 0.25), readings
    try:
        client.broken.on()
    except Exception as e:
        assert "500" in str(e), e
    else:
        raise SystemExit("a plug answering 500 powered on")
    # Upstream's `j` on the same driver.
    subprocess.run(["j", "plug", "on"], check=True, timeout=60)

expected = [
    ("POST", "/relay/0", "turn=on", auth),
    ("GET", "/relay/0?turn=off", "", auth),
    ("GET", "/meter", "", auth),
    ("GET", "/broken", "", None),
    ("POST", "/relay/0", "turn=on", auth),
]
assert seen == expected, seen
print("python http power ok")
