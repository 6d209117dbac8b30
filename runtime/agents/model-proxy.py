#!/usr/bin/env python3
# lw-model-proxy: the one way an agent in a sandbox reaches its model.
#
# It listens on the sandbox's internal network (known there as lw-model) and
# forwards exactly one endpoint (LW_MODEL_ENDPOINT, e.g. "POST /v1/messages")
# to one upstream (LW_MODEL_UPSTREAM, https://HOST[:PORT]) over TLS, checked
# against the system's authorities or /run/lw-agent/ca.pem when present.
# Every credential the agent sends is dropped; the real key is read from
# /run/lw-agent/key (a host file, 0600, mounted read-only) for each request,
# so the key never enters the sandbox, its image or its environment, and a
# key rotated on the host takes effect on the next request.  Anything else
# is answered 403.  One log line per request, on stderr: never a header or
# a body.  It listens only on its address on the sandbox's network (what its
# name there, lw-model, resolves to), not on the shared network that leads
# out, so no other container can spend the key.
import http.client
import http.server
import os
import socket
import ssl
import sys
import time

UPSTREAM = os.environ["LW_MODEL_UPSTREAM"]
METHOD, PATH = os.environ["LW_MODEL_ENDPOINT"].split()
HEADER = os.environ["LW_MODEL_KEY_HEADER"]
KEY_FILE = "/run/lw-agent/key"
CA_FILE = "/run/lw-agent/ca.pem"
SCHEME, REST = UPSTREAM.split("://", 1)
HOSTPORT = REST.rstrip("/")
HOST, _, PORT = HOSTPORT.partition(":")
PORT = int(PORT or (443 if SCHEME == "https" else 80))

# Credentials and hop-by-hop headers the agent may send: never forwarded.
DROP = {
    "authorization", "proxy-authorization", "x-api-key", "api-key", "cookie",
    "x-goog-api-key", "openai-organization", "openai-project",
    "host", "connection", "keep-alive", "proxy-connection", "te", "trailer",
    "transfer-encoding", "upgrade", "content-length",
}
HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
       "proxy-connection", "content-length"}


def log(*words):
    print(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), *words, file=sys.stderr, flush=True)


def tls():
    cafile = CA_FILE if os.path.exists(CA_FILE) else None
    return ssl.create_default_context(cafile=cafile)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "lw-model-proxy"

    def log_message(self, fmt, *args):
        pass

    def refuse(self, status, why):
        body = ('{"type":"error","error":{"type":"lw_model_proxy","message":"lw-model-proxy: %s"}}'
                % why).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline().strip():
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def handle_any(self):
        path = self.path.split("?", 1)[0]
        if self.command != METHOD or path != PATH:
            log("deny", self.command, path, HOSTPORT)
            self.body()
            return self.refuse(403, "only %s %s is forwarded" % (METHOD, PATH))
        data = self.body()
        try:
            with open(KEY_FILE) as f:
                key = f.read().strip()
        except OSError:
            key = ""
        if not key:
            log("nokey", self.command, path, HOSTPORT)
            return self.refuse(503, "no key on the host for this sandbox (lw-sandbox run writes it)")
        headers = {k: v for k, v in self.headers.items() if k.lower() not in DROP}
        headers["Host"] = HOSTPORT if PORT not in (80, 443) else HOST
        headers["Content-Length"] = str(len(data))
        if HEADER == "x-api-key":
            headers["x-api-key"] = key
        else:
            headers["Authorization"] = "Bearer " + key
        try:
            if SCHEME == "https":
                conn = http.client.HTTPSConnection(HOST, PORT, context=tls(), timeout=600)
            else:
                conn = http.client.HTTPConnection(HOST, PORT, timeout=600)
            conn.request(self.command, self.path, body=data, headers=headers)
            resp = conn.getresponse()
        except Exception as e:  # the agent sees why, as its provider's error
            log("fail", self.command, path, HOSTPORT, type(e).__name__)
            return self.refuse(502, "cannot reach %s: %s" % (HOSTPORT, type(e).__name__))
        log("forward", self.command, path, HOSTPORT, resp.status)
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in HOP:
                self.send_header(k, v)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        while True:
            chunk = resp.read1(65536)
            if not chunk:
                break
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        conn.close()

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = handle_any


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


if __name__ == "__main__":
    addr = socket.gethostbyname(os.environ.get("LW_MODEL_NAME", "lw-model"))
    srv = Server((addr, 8080), Handler)
    log("lw-model-proxy: listening on %s:8080, forwarding" % addr, METHOD, PATH, "to", UPSTREAM)
    srv.serve_forever()
