#!/usr/bin/env python3
# lw-model-proxy: the one way an agent in a sandbox reaches its model.
#
# It listens on the sandbox's internal network (known there as lw-model) and
# forwards exactly the kit's endpoints (LW_MODEL_ENDPOINT, e.g. "POST
# /v1/messages", or several separated by commas; "{model}" in a path stands
# for one model name, as Gemini's /v1beta/models/{model}:generateContent)
# to one upstream (LW_MODEL_UPSTREAM, https://HOST[:PORT]) over TLS, checked
# against the system's authorities or /run/lw-agent/ca.pem when present.
# Every credential the agent sends is dropped (headers, and a key= query
# parameter, Google's other way to send one); the real key is read from
# /run/lw-agent/key (a host file, 0600, mounted read-only) for each request,
# so the key never enters the sandbox, its image or its environment, and a
# key rotated on the host takes effect on the next request.  Anything else
# is answered 403.  One log line per request, on stderr: never a header or
# a body (refusals at most one a second of each kind, with a count).  It listens only on its address on the sandbox's network (what its
# name there, lw-model, resolves to), not on the shared network that leads
# out, so no other container can spend the key.
#
# It is a door that distrusts the agent's volume (issue 35):
# - Memory is bounded whatever the agent sends: one event loop, no thread per
#   connection; at most MAX_CONNS connections (more are answered 503 and
#   closed); a request head of at most 32 KiB within 10 s; a body of at most
#   LW_MODEL_MAX_REQUEST bytes (413 as soon as it is known to be larger,
#   while it streams, never buffered beyond the cap), and all bodies held at
#   once within BUDGET (else 503, try again); an idle body read ends after
#   30 s.  Answers stream back with backpressure; of an answer at most
#   64 KiB is held, to read its usage.
# - The head is read strictly: a folded header line, a bare CR or LF (a head
#   ended by bare LFs is refused at once, not waited on), a malformed line, a duplicate hop or framing header (host, content-length,
#   transfer-encoding, connection, ...), both content-length and
#   transfer-encoding, or a coding other than chunked are refused 400.
# - Caps per sandbox: requests forwarded per minute (LW_MODEL_MAX_RPM), tokens
#   per hour and per run (LW_MODEL_MAX_TOKENS_HOUR, _RUN; 0 is no cap), or as
#   /run/lw-agent/caps says when it exists (lw-sandbox run writes it from
#   .loopwright/config, so a changed cap holds from the next run).
#   Tokens are what the provider's `usage` says (input, cache and output),
#   counted as the answer streams, so a cap crossed in the middle of one
#   answer refuses every request after it (the answer itself is delivered
#   whole: its tokens are spent already).  Over a cap: the provider's 429
#   shape with retry-after.  A run is what /run/lw-agent/run names
#   (lw-sandbox run writes it); a new one starts the run count at 0.
# - The counts are kept in /run/lw-usage/usage.json (host-side
#   ROOT/state/agent-usage/NAME, read by lw-sandbox ls and run), so a
#   restarted proxy keeps its hour and its run; each cap episode is listed
#   there once, for lw-sandbox run to tell the person.  An episode of a cap
#   starts with a refusal after a forward, unless the same cap refused within
#   its window (a minute for max-rpm, an hour for max-tokens-hour, the same
#   run for max-tokens-run): under steady traffic a request slips through
#   each time the window frees one, and that is not news.
# Errors are in the provider's shape (Anthropic's, OpenAI's for
# /v1/responses, Google's for the Gemini API) so the agent's CLI shows and
# handles them as its own.
import asyncio
import collections
import json
import math
import os
import re
import socket
import ssl
import sys
import time
import urllib.parse

ENV = os.environ
UPSTREAM = ENV["LW_MODEL_UPSTREAM"]
ENDPOINTS = [tuple(e.split()) for e in ENV["LW_MODEL_ENDPOINT"].split(",")]
METHOD, PATH = ENDPOINTS[0]
# A path's {model}: one name, never a '/', '?', ':' or '%'.
ROUTES = [(m, re.compile("".join("[A-Za-z0-9][A-Za-z0-9._-]*" if w == "{model}" else re.escape(w)
                                  for w in re.split(r"(\{model\})", p))))
          for m, p in ENDPOINTS]
HEADER = ENV["LW_MODEL_KEY_HEADER"]
KEY_DIR = ENV.get("LW_MODEL_DIR", "/run/lw-agent")
USAGE_DIR = ENV.get("LW_MODEL_USAGE", "/run/lw-usage")
KEY_FILE = os.path.join(KEY_DIR, "key")
CA_FILE = os.path.join(KEY_DIR, "ca.pem")
RUN_FILE = os.path.join(KEY_DIR, "run")
CAPS_FILE = os.path.join(KEY_DIR, "caps")
SCHEME, REST = UPSTREAM.split("://", 1)
HOSTPORT = REST.rstrip("/")
HOST, _, PORT = HOSTPORT.partition(":")
PORT = int(PORT or (443 if SCHEME == "https" else 80))
OPENAI = PATH.endswith("/responses")
GOOGLE = HEADER == "x-goog-api-key"
# Google's status names for the answers the proxy gives.
GOOGLE_STATUS = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 413: "INVALID_ARGUMENT",
                 429: "RESOURCE_EXHAUSTED", 431: "INVALID_ARGUMENT", 501: "UNIMPLEMENTED",
                 502: "UNAVAILABLE", 503: "UNAVAILABLE"}
# The agent kit, to name its caps as .loopwright/config spells them.
KIT = ENV.get("LW_MODEL_KIT") or "KIT"


def number(name, default):
    v = ENV.get(name, "")
    return int(v) if v else default


MAX_REQUEST = number("LW_MODEL_MAX_REQUEST", 8 << 20)
CAPS = {"max-rpm": number("LW_MODEL_MAX_RPM", 0),
        "max-tokens-hour": number("LW_MODEL_MAX_TOKENS_HOUR", 0),
        "max-tokens-run": number("LW_MODEL_MAX_TOKENS_RUN", 0)}
MAX_CONNS = number("LW_MODEL_MAX_CONNS", 256)
BUDGET = max(32 << 20, 4 * MAX_REQUEST)
HEAD_MAX = 32 << 10
HEAD_TIMEOUT = 10
KEEPALIVE = 60
BODY_IDLE = 30
UPSTREAM_TIMEOUT = 600
CHUNK = 64 << 10
TAIL = 64 << 10  # of a whole (not streamed) answer, kept to read its usage
# Usage fields that are tokens the provider processed (OpenAI's input_tokens
# already holds its cached ones; Anthropic's cache fields are beside it).
# Gemini's usageMetadata: the prompt (its cached part inside it), the
# answer, the thinking and the tool-use prompt; totalTokenCount is their sum.
TOKEN_FIELDS = ("input_tokens", "output_tokens", "cache_creation_input_tokens",
                "cache_read_input_tokens", "promptTokenCount", "candidatesTokenCount",
                "thoughtsTokenCount", "toolUsePromptTokenCount")

# Credentials and hop-by-hop headers the agent may send: never forwarded.
DROP = {
    "authorization", "proxy-authorization", "x-api-key", "api-key", "cookie",
    "x-goog-api-key", "openai-organization", "openai-project",
    "host", "connection", "keep-alive", "proxy-connection", "te", "trailer",
    "transfer-encoding", "upgrade", "content-length", "expect",
}
HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
       "proxy-connection", "content-length"}
# Headers that may appear once: a second one is how requests are smuggled.
SINGLE = HOP | {"host", "expect", "authorization", "x-api-key", "x-goog-api-key"}
TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def log(*words):
    print(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), *words, file=sys.stderr, flush=True)


QUIET = {}


def log_refusal(action, *words):
    """Logs a refusal, at most one a second for each kind; says how many it left out."""
    key = (action,) + words[3:]
    now = time.monotonic()
    q = QUIET.setdefault(key, [-10.0, 0])
    if now - q[0] < 1:
        q[1] += 1
        return
    more = ["(%d more since)" % q[1]] if q[1] else []
    q[0], q[1] = now, 0
    log(action, *words, *more)


def tls():
    cafile = CA_FILE if os.path.exists(CA_FILE) else None
    return ssl.create_default_context(cafile=cafile)


class Refuse(Exception):
    """An answer instead of a forward: status, the provider's error type, why."""

    def __init__(self, status, kind, why, retry=None, close=True, logged=False):
        super().__init__(why)
        self.status, self.kind, self.why, self.retry, self.close = status, kind, why, retry, close
        self.logged = logged


REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 413: "Payload Too Large",
           429: "Too Many Requests", 431: "Request Header Fields Too Large",
           501: "Not Implemented", 502: "Bad Gateway", 503: "Service Unavailable"}


def error_response(r):
    msg = "lw-model-proxy: " + r.why
    if OPENAI:
        doc = {"error": {"message": msg, "type": r.kind, "param": None, "code": r.kind}}
    elif GOOGLE:
        doc = {"error": {"code": r.status, "message": msg,
                         "status": GOOGLE_STATUS.get(r.status, "UNKNOWN")}}
    else:
        doc = {"type": "error", "error": {"type": r.kind, "message": msg}}
    body = json.dumps(doc).encode()
    head = ["HTTP/1.1 %d %s" % (r.status, REASONS.get(r.status, "Error")),
            "Content-Type: application/json", "Content-Length: %d" % len(body)]
    if r.retry is not None:
        head.append("Retry-After: %d" % r.retry)
    head.append("Connection: close" if r.close else "Keep-Alive: timeout=%d" % (KEEPALIVE // 2))
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class Budget:
    """The bytes of request bodies held at once."""

    def __init__(self, total):
        self.total, self.used = total, 0

    def take(self, n):
        if self.used + n > self.total:
            raise Refuse(503, "overloaded_error", "too many request bodies at once; try again", retry=1)
        self.used += n

    def give(self, n):
        self.used -= n


BODIES = Budget(BUDGET)


class Meter:
    """Requests per minute and tokens per hour and per run, kept across restarts."""

    def __init__(self):
        self.starts = collections.deque()  # monotonic times of forwards in the last minute
        self.minutes = {}  # minute (unix time // 60) -> tokens
        self.run, self.run_tokens, self.total = "", 0, 0
        self.forwarded = self.refused = 0
        self.capped = False
        self.episodes = []
        self.load()

    def load(self):
        try:
            with open(os.path.join(USAGE_DIR, "usage.json")) as f:
                u = json.load(f)
            self.minutes = {int(m): int(t) for m, t in u.get("minutes", [])}
            self.run, self.run_tokens = u.get("run", ""), int(u.get("tokens_run", 0))
            self.total = int(u.get("tokens_total", 0))
            self.forwarded, self.refused = int(u.get("forwarded", 0)), int(u.get("refused", 0))
            self.episodes = u.get("caps", [])[-20:]
        except (OSError, ValueError, TypeError, AttributeError):
            pass

    def save(self):
        now = int(time.time())
        self.minutes = {m: t for m, t in self.minutes.items() if m > now // 60 - 60}
        doc = {"version": 1, "updated": now, "run": self.run, "tokens_run": self.run_tokens,
               "tokens_hour": self.hour(now), "tokens_total": self.total,
               "forwarded": self.forwarded, "refused": self.refused,
               "minutes": sorted(self.minutes.items()), "caps": self.episodes[-20:]}
        tmp = os.path.join(USAGE_DIR, ".usage.json.tmp")
        try:
            with open(tmp, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, os.path.join(USAGE_DIR, "usage.json"))
        except OSError:
            pass

    def hour(self, now):
        return sum(t for m, t in self.minutes.items() if m > now // 60 - 60)

    def caps(self):
        try:
            with open(CAPS_FILE) as f:
                c = json.load(f)
            return {k: int(c.get(k, v)) for k, v in CAPS.items()}
        except (OSError, ValueError, TypeError, AttributeError):
            return CAPS

    def current_run(self):
        try:
            with open(RUN_FILE) as f:
                run = f.read().strip()
        except OSError:
            run = ""
        if run != self.run:
            self.run, self.run_tokens = run, 0

    def admit(self):
        """Counts a forward, or raises the 429 of the first cap reached."""
        self.current_run()
        caps = self.caps()
        MAX_RPM, MAX_TOKENS_HOUR, MAX_TOKENS_RUN = (caps["max-rpm"], caps["max-tokens-hour"],
                                                    caps["max-tokens-run"])
        mono, now = time.monotonic(), time.time()
        while self.starts and self.starts[0] <= mono - 60:
            self.starts.popleft()
        over = None
        if MAX_RPM and len(self.starts) >= MAX_RPM:
            over = ("max-rpm", MAX_RPM, "requests in a minute", math.ceil(self.starts[0] + 60 - mono))
        elif MAX_TOKENS_HOUR and self.hour(now) >= MAX_TOKENS_HOUR:
            left, wait = self.hour(now), 60
            for m in sorted(self.minutes):
                if m <= now // 60 - 60:
                    continue
                left -= self.minutes[m]
                wait = (m + 61) * 60 - now
                if left < MAX_TOKENS_HOUR:
                    break
            over = ("max-tokens-hour", MAX_TOKENS_HOUR, "tokens in an hour", math.ceil(wait))
        elif MAX_TOKENS_RUN and self.run_tokens >= MAX_TOKENS_RUN:
            over = ("max-tokens-run", MAX_TOKENS_RUN, "tokens in this run (the next lw-sandbox run starts again at 0)", 3600)
        if over is None:
            self.starts.append(mono)
            self.forwarded += 1
            self.capped = False
            self.save()
            return
        cap, limit, what, retry = over
        retry = max(1, retry)
        self.refused += 1
        if not self.capped:
            self.capped = True
            if not self.told(cap, now):
                self.episodes.append({"cap": cap, "limit": limit, "at": int(now), "retry_after": retry,
                                      "run": self.run,
                                      "n": (self.episodes[-1]["n"] + 1) if self.episodes else 1})
        for ep in reversed(self.episodes):
            if ep.get("cap") == cap:
                ep["last"] = int(now)
                break
        self.save()
        raise Refuse(429, "rate_limit_error",
                     "over the sandbox's cap agent.%s.%s: %d %s; try again in %d s" % (KIT, cap, limit, what, retry),
                     retry=retry, close=False)

    def told(self, cap, now):
        """True when an episode of `cap` is still open: its last refusal is
        within the cap's window (for the run cap, in this run)."""
        for ep in reversed(self.episodes):
            if ep.get("cap") != cap:
                continue
            if cap == "max-tokens-run":
                return ep.get("run") == self.run
            window = 60 if cap == "max-rpm" else 3600
            return now - int(ep.get("last", ep.get("at", 0))) < window
        return False

    def charge(self, n):
        if n <= 0:
            return
        self.current_run()
        self.run_tokens += n
        self.total += n
        m = int(time.time()) // 60
        self.minutes[m] = self.minutes.get(m, 0) + n
        self.save()


METER = Meter()


class Usage:
    """Reads the provider's `usage` out of an answer as it streams and charges the meter.

    Usage values are cumulative within one answer (Anthropic's message_delta
    repeats output_tokens so far), so each field counts by its largest value."""

    def __init__(self, sse):
        self.sse, self.buf, self.skip, self.seen, self.charged = sse, bytearray(), False, {}, 0

    def usage(self, u):
        if not isinstance(u, dict):
            return
        for f in TOKEN_FIELDS:
            v = u.get(f)
            if isinstance(v, int) and v > self.seen.get(f, 0):
                self.seen[f] = v
        n = sum(self.seen.values())
        METER.charge(n - self.charged)
        self.charged = n

    def event(self, doc):
        if not isinstance(doc, dict):
            return
        self.usage(doc.get("usage"))
        self.usage(doc.get("usageMetadata"))
        for k in ("message", "response"):
            if isinstance(doc.get(k), dict):
                self.usage(doc[k].get("usage"))

    def tail_usage(self, data):
        """The last `usage` (or Gemini's `usageMetadata`) object in `data`
        (the tail of a long line or answer)."""
        text = bytes(data).decode("utf-8", "replace")
        i = max(text.rfind('"usage"'), text.rfind('"usageMetadata"'))
        j = text.find("{", i) if i >= 0 else -1
        if j >= 0:
            try:
                self.usage(json.JSONDecoder().raw_decode(text, j)[0])
            except ValueError:
                pass

    def feed(self, data):
        self.buf += data
        if not self.sse:
            # A whole answer: its usage is near its end; keep only a tail.
            if len(self.buf) > TAIL:
                del self.buf[:len(self.buf) - TAIL]
            return
        while True:
            i = self.buf.find(b"\n")
            if i < 0:
                if len(self.buf) > TAIL:  # a long line: keep its tail only
                    del self.buf[:len(self.buf) - TAIL]
                    self.skip = True
                break
            line = bytes(self.buf[:i]).strip()
            del self.buf[:i + 1]
            if self.skip:  # the end of a long line (OpenAI's whole response)
                self.skip = False
                self.tail_usage(line)
            elif line.startswith(b"data:"):
                try:
                    self.event(json.loads(line[5:]))
                except ValueError:
                    pass

    def finish(self):
        if not self.sse:
            self.tail_usage(self.buf)


def parse_head(raw):
    """The request line and headers, strictly; raises Refuse(400)."""
    lines = raw[:-4].split(b"\r\n")
    for line in lines:
        if b"\n" in line or b"\r" in line or b"\0" in line:
            raise Refuse(400, "invalid_request_error", "a bare CR, LF or NUL in the request head")
    try:
        method, target, version = lines[0].decode("ascii").split(" ")
    except (UnicodeDecodeError, ValueError):
        raise Refuse(400, "invalid_request_error", "a malformed request line")
    if version not in ("HTTP/1.1", "HTTP/1.0") or not TOKEN.fullmatch(method.encode()):
        raise Refuse(400, "invalid_request_error", "a malformed request line")
    headers, names = [], set()
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t"):
            raise Refuse(400, "invalid_request_error", "a folded header line (obsolete line folding is refused)")
        name, sep, value = line.partition(b":")
        if not sep or not TOKEN.fullmatch(name):
            raise Refuse(400, "invalid_request_error", "a malformed header line")
        name = name.decode().lower()
        if name in SINGLE and name in names:
            raise Refuse(400, "invalid_request_error", "a duplicate %s header" % name)
        names.add(name)
        headers.append((name, value.strip(b" \t").decode("latin-1")))
    return method, target, version, headers


async def read_exact(reader, n):
    return await asyncio.wait_for(reader.readexactly(n), BODY_IDLE)


async def read_line(reader):
    line = await asyncio.wait_for(reader.readuntil(b"\n"), BODY_IDLE)
    if len(line) > 4096:
        raise Refuse(400, "invalid_request_error", "a malformed chunk")
    return line


async def read_body(reader, length, chunked):
    """The body, never more than MAX_REQUEST bytes held, within the budget."""
    body, held = bytearray(), 0
    try:
        if not chunked:
            BODIES.take(length)
            held = length
            while len(body) < length:
                part = await asyncio.wait_for(reader.read(min(CHUNK, length - len(body))), BODY_IDLE)
                if not part:
                    raise asyncio.IncompleteReadError(bytes(body), length)
                body += part
            return bytes(body)
        while True:
            line = await read_line(reader)
            try:
                size = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                raise Refuse(400, "invalid_request_error", "a malformed chunk size")
            if size == 0:
                while (await read_line(reader)).strip():
                    pass
                return bytes(body)
            if len(body) + size > MAX_REQUEST:
                raise too_large()
            BODIES.take(size)
            held += size
            while size:
                part = await asyncio.wait_for(reader.read(min(CHUNK, size)), BODY_IDLE)
                if not part:
                    raise asyncio.IncompleteReadError(b"", size)
                body += part
                size -= len(part)
            if (await read_line(reader)).strip():
                raise Refuse(400, "invalid_request_error", "a malformed chunk")
    finally:
        BODIES.give(held)


def too_large():
    return Refuse(413, "request_too_large",
                  "the request is larger than agent.%s.max-request (%d bytes)" % (KIT, MAX_REQUEST))


async def discard(reader, seconds=2.0):
    """Reads what the agent still sends, for a moment, so that closing does not
    reset the connection before the agent reads the answer."""
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            part = await asyncio.wait_for(reader.read(CHUNK), max(0.01, end - time.monotonic()))
            if not part:
                return
    except (asyncio.TimeoutError, ConnectionError, OSError):
        pass


def without_key(target):
    """The target without a `key=` query parameter: Google takes an API key
    there too, and the agent's must never reach the upstream."""
    path, sep, query = target.partition("?")
    if not sep:
        return target
    # A name is compared decoded ("%6Bey" is "key" to the upstream).
    kept = [p for p in query.split("&")
            if urllib.parse.unquote_plus(p.split("=", 1)[0]).strip().lower() not in ("key", "api_key", "")]
    return path + ("?" + "&".join(kept) if kept else "")


async def forward(method, target, headers, body, writer):
    """Sends the request upstream with the key and streams the answer back."""
    try:
        with open(KEY_FILE) as f:
            key = f.read().strip()
    except OSError:
        key = ""
    path = target.split("?", 1)[0]
    if not key:
        log("nokey", method, path, HOSTPORT)
        raise Refuse(503, "api_error", "no key on the host for this sandbox (lw-sandbox run writes it)",
                     close=False, logged=True)
    METER.admit()
    out = [(k, v) for k, v in headers if k not in DROP]
    out.append(("Host", HOSTPORT if PORT not in (80, 443) else HOST))
    out.append(("Content-Length", str(len(body))))
    out.append(("Connection", "close"))
    if HEADER == "x-api-key":
        out.append(("x-api-key", key))
    elif HEADER == "x-goog-api-key":
        out.append(("x-goog-api-key", key))
    else:
        out.append(("Authorization", "Bearer " + key))
    head = "%s %s HTTP/1.1\r\n" % (method, without_key(target)) + "".join("%s: %s\r\n" % kv for kv in out) + "\r\n"
    try:
        if SCHEME == "https":
            ur, uw = await asyncio.wait_for(asyncio.open_connection(
                HOST, PORT, ssl=tls(), server_hostname=HOST, limit=HEAD_MAX), 30)
        else:
            ur, uw = await asyncio.wait_for(asyncio.open_connection(HOST, PORT, limit=HEAD_MAX), 30)
    except (OSError, asyncio.TimeoutError, ssl.SSLError) as e:
        log("fail", method, path, HOSTPORT, type(e).__name__)
        raise Refuse(502, "api_error", "cannot reach %s: %s" % (HOSTPORT, type(e).__name__), logged=True)
    try:
        try:
            uw.write(head.encode("latin-1"))
            uw.write(body)
            del body
            await uw.drain()
            raw = await asyncio.wait_for(ur.readuntil(b"\r\n\r\n"), UPSTREAM_TIMEOUT)
            lines = raw[:-4].decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            rheaders = [tuple(s.strip() for s in l.split(":", 1)) for l in lines[1:] if ":" in l]
        except (OSError, ValueError, IndexError, asyncio.TimeoutError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError, ssl.SSLError) as e:
            log("fail", method, path, HOSTPORT, type(e).__name__)
            raise Refuse(502, "api_error", "cannot reach %s: %s" % (HOSTPORT, type(e).__name__), logged=True)
        log("forward", method, path, HOSTPORT, status)
        lower = {k.lower(): v for k, v in rheaders}
        sse = "event-stream" in lower.get("content-type", "")
        usage = Usage(sse)
        reply = ["HTTP/1.1 %d %s" % (status, REASONS.get(status, "Upstream"))]
        reply += ["%s: %s" % (k, v) for k, v in rheaders if k.lower() not in HOP]
        reply += ["Transfer-Encoding: chunked", "Keep-Alive: timeout=%d" % (KEEPALIVE // 2)]
        writer.write(("\r\n".join(reply) + "\r\n\r\n").encode("latin-1"))

        async def send(data):
            usage.feed(data)
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            await writer.drain()

        async def upstream(n):
            return await asyncio.wait_for(ur.read(n), UPSTREAM_TIMEOUT)

        if "chunked" in lower.get("transfer-encoding", "").lower():
            while True:
                line = await asyncio.wait_for(ur.readuntil(b"\n"), UPSTREAM_TIMEOUT)
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    break
                while size:
                    part = await upstream(min(CHUNK, size))
                    if not part:
                        raise ConnectionError("upstream closed")
                    size -= len(part)
                    await send(part)
                await asyncio.wait_for(ur.readuntil(b"\n"), UPSTREAM_TIMEOUT)
        elif "content-length" in lower:
            left = int(lower["content-length"])
            while left > 0:
                part = await upstream(min(CHUNK, left))
                if not part:
                    raise ConnectionError("upstream closed")
                left -= len(part)
                await send(part)
        else:
            while True:
                part = await upstream(CHUNK)
                if not part:
                    break
                await send(part)
        usage.finish()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
    finally:
        uw.close()


class Conns:
    open = 0


async def read_head(reader, got):
    """The request head, line by line up to its empty line, into `got`.
    A head that ends with bare LFs is refused at once (400), not waited on
    for a CR LF CR LF that never comes."""
    while True:
        line = await reader.readuntil(b"\n")
        got.append(line)
        if sum(map(len, got)) > HEAD_MAX:
            raise asyncio.LimitOverrunError("head", HEAD_MAX)
        if line in (b"\r\n", b"\n"):
            raw = b"".join(got)
            if not raw.endswith(b"\r\n\r\n") or len(got) == 1:
                raise Refuse(400, "invalid_request_error", "a bare CR, LF or NUL in the request head")
            return raw


async def one_request(reader, writer, first):
    """Serves one request; returns whether the connection may serve another."""
    got = []
    try:
        raw = await asyncio.wait_for(read_head(reader, got), HEAD_TIMEOUT if first else KEEPALIVE)
    except asyncio.LimitOverrunError:
        raise Refuse(431, "invalid_request_error", "a request head over %d bytes" % HEAD_MAX)
    except asyncio.IncompleteReadError as e:
        if b"".join(got).strip() or e.partial.strip():
            raise Refuse(400, "invalid_request_error", "an incomplete request head")
        return False
    method, target, version, headers = parse_head(raw)
    h = dict(headers)
    if method == "CONNECT":
        log_refusal("deny", method, target, HOSTPORT)
        raise Refuse(501, "invalid_request_error", "CONNECT is not supported", logged=True)
    path = target.split("?", 1)[0]
    if not target.startswith("/") or not any(m == method and r.fullmatch(path) for m, r in ROUTES):
        log_refusal("deny", method, path if target.startswith("/") else "-", HOSTPORT)
        raise Refuse(403, "permission_error", "only %s %s forwarded" % (
            ", ".join("%s %s" % e for e in ENDPOINTS), "is" if len(ENDPOINTS) == 1 else "are"), logged=True)
    chunked = "transfer-encoding" in h
    if chunked and "content-length" in h:
        raise Refuse(400, "invalid_request_error", "both content-length and transfer-encoding")
    if chunked and h["transfer-encoding"].strip().lower() != "chunked":
        raise Refuse(400, "invalid_request_error", "a transfer coding other than chunked")
    length = 0
    if not chunked:
        if not re.fullmatch(r"[0-9]{1,15}", h.get("content-length", "0")):
            raise Refuse(400, "invalid_request_error", "a malformed content-length")
        length = int(h.get("content-length", "0"))
        if length > MAX_REQUEST:
            raise too_large()
    keep = version == "HTTP/1.1" and "close" not in h.get("connection", "").lower()
    if h.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    try:
        body = await read_body(reader, length, chunked)
        await forward(method, target, headers, body, writer)
    except Refuse as r:
        r.close = r.close or not keep
        r.route = (method, path)
        raise
    return keep


async def serve(reader, writer):
    if Conns.open >= MAX_CONNS:
        log_refusal("refuse", METHOD, PATH, HOSTPORT, 503, "overloaded_error")
        writer.write(error_response(Refuse(503, "overloaded_error",
                                           "too many connections at once; try again", retry=1)))
        try:
            await asyncio.wait_for(writer.drain(), 1)
        except (OSError, asyncio.TimeoutError):
            pass
        writer.close()
        return
    Conns.open += 1
    first = True
    try:
        while True:
            try:
                if not await one_request(reader, writer, first):
                    break
            except Refuse as r:
                if not r.logged:
                    log_refusal("refuse", *getattr(r, "route", (METHOD, PATH)), HOSTPORT, r.status, r.kind)
                writer.write(error_response(r))
                await asyncio.wait_for(writer.drain(), BODY_IDLE)
                if r.close:
                    writer.write_eof()
                    await discard(reader)
                    break
            first = False
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
            ValueError, ssl.SSLError, RuntimeError):
        pass
    finally:
        Conns.open -= 1
        writer.close()


async def main():
    addr = ENV.get("LW_MODEL_LISTEN") or socket.gethostbyname(ENV.get("LW_MODEL_NAME", "lw-model"))
    port = number("LW_MODEL_PORT", 8080)
    srv = await asyncio.start_server(serve, addr, port, limit=HEAD_MAX, backlog=512)
    port = srv.sockets[0].getsockname()[1]
    log("lw-model-proxy: listening on %s:%d, forwarding" % (addr, port), ", ".join("%s %s" % e for e in ENDPOINTS), "to", UPSTREAM,
        "max-request", MAX_REQUEST, *("%s %s" % (k, v or "off") for k, v in METER.caps().items()))
    async with srv:
        await srv.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
