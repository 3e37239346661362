"""A local stand-in for the SageMaker runtime: serves POST /endpoints/<name>/invocations and
forwards the body to a SemIf adapter process, so the real boto3 sagemaker-runtime client can be
pointed at it with endpoint_url."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx


class RuntimeShim:
    def __init__(self, routes: dict[str, str]):
        self.routes = routes  # endpoint name -> adapter base URL ("*": any endpoint)
        shim = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                parts = self.path.strip("/").split("/")
                url = shim.routes.get(parts[1] if len(parts) == 3 else "", shim.routes.get("*"))
                if len(parts) != 3 or parts[0] != "endpoints" or parts[2] != "invocations" or url is None:
                    self.send_response(404)
                    self.send_header("content-type", "application/json")
                    self.end_headers()
                    self.wfile.write(b'{"message": "Endpoint not found"}')
                    return
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                resp = httpx.post(url + "/invocations", content=body,
                                  headers={"content-type": self.headers.get("content-type", "application/json")},
                                  timeout=120)
                self.send_response(resp.status_code)
                self.send_header("content-type", resp.headers.get("content-type", "application/json"))
                self.send_header("x-Amzn-Invoked-Production-Variant", "AllTraffic")
                self.end_headers()
                self.wfile.write(resp.content)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
