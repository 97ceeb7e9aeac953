"""A loopback HTTP file server for download tests: 127.0.0.1, a free port, a thread, no network.

    with FileServer({"models/options.json": b"..."}) as server:
        server.url                      # http://127.0.0.1:PORT/
        server.cut["models/w.hdf5"] = [100]   # the next response sends 100 bytes, then drops the connection
        ... download ...
        server.requests                 # [(path, Range header or None), ...]

It answers GET with 200 and the whole file, or 206 and the rest for `Range: bytes=N-` (416 with
`Content-Range: bytes */SIZE` past the end), and 404 for a path it does not serve. Every response
announces the file's true Content-Length, so a cut response is a truncated body, as a broken connection
leaves it.
"""

from __future__ import annotations

import http.server
import re
import threading


class FileServer:
    """Serves `files` (path under the root -> bytes) until the `with` block ends.

    Attributes:
      url: the root address, ending in "/".
      files: what is served (may be changed while it runs).
      requests: (path, Range header or None) of every GET, in order.
      cut: path -> byte counts: each response for that path takes the next count, sends that many bytes
        of its body and closes the connection.
    """

    def __init__(self, files: dict[str, bytes]):
        self.files = dict(files)
        self.requests: list[tuple[str, str | None]] = []
        self.cut: dict[str, list[int]] = {}
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FileServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _handler(server: FileServer) -> type:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):  # noqa: N802 (the name http.server calls)
            path = self.path.lstrip("/")
            requested = self.headers.get("Range")
            server.requests.append((path, requested))
            if path not in server.files:
                self.send_error(404, "Not Found")
                return
            data = server.files[path]
            start = 0
            match = re.fullmatch(r"bytes=(\d+)-", requested or "")
            if match:
                start = int(match.group(1))
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            body = data[start:]
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            cuts = server.cut.get(path)
            if cuts:
                self.wfile.write(body[: cuts.pop(0)])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

        def log_message(self, *args):  # quiet: pytest shows failures, not access logs
            pass

    return Handler
