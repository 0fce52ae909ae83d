"""Payload encryption (AES-GCM) and the codec server that lets the Web UI and CLI read rollouts.

Rollouts carry prompts, tool outputs and model answers, which may be private data. With
`GYMFLOW_ENCRYPTION_KEY` set, every payload a worker or client writes (inputs, results, activity
arguments, memos) is encrypted before it leaves the process: the Temporal server and anyone who
reads its database see `binary/encrypted` blobs. The key is worker/client configuration, never
workflow input, so it cannot end up in a history.

Rotation: each encrypted payload names the key that sealed it (`encryption-key-id` metadata), so
a new key can be rolled out as `GYMFLOW_ENCRYPTION_KEY` while the old one stays readable through
`GYMFLOW_DECRYPTION_KEYS`. A key is `[id:]base64` of 16, 24 or 32 random bytes; without an id,
the id is derived from the key (the first 8 hex digits of its SHA-256).

The codec server (`gymflow codec-server`) speaks Temporal's codec server protocol: `POST /encode`
and `POST /decode` with `{"payloads": [...]}` in protobuf JSON, CORS for the Web UI's origin and
optional auth. Point the Web UI's "codec server" setting, or
`temporal workflow show --codec-endpoint URL [--codec-auth VALUE]`, at it to read encrypted
rollouts. It decrypts with the keys of its own configuration and must only listen where the
people allowed to read rollouts can reach it.

Auth (`GYMFLOW_CODEC_AUTH`), two ways in:

* The CLI sends the exact value as its `Authorization` header (`--codec-auth VALUE`).
* A browser logs in once: `GET /login` shows a form, posting the value there sets an HttpOnly,
  `SameSite=Strict` session cookie (an HMAC of the value, so the value itself is never stored in
  the browser; changing it logs every browser out). The Web UI then sends the cookie with every
  decode when its codec setting "Include cross-origin credentials" is on: the UI and the codec
  server are the same site (same host, other ports), so the cookie travels, and the CORS policy
  (the UI's origins only, credentials allowed) keeps every other page from reading the answer.
  The UI's other option, passing the user's access token, needs an HTTPS codec endpoint and an
  OAuth-enabled UI, which the embedded dev server has not; a gymflow codec server does not check
  such tokens.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from google.protobuf import json_format
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.converter import PayloadCodec

from gymflow.envs.errors import CodecKeyError

ENCODING = b"binary/encrypted"
"""The `encoding` metadata of an encrypted payload."""
KEY_ID = "encryption-key-id"
"""Metadata naming the key that encrypted a payload (for rotation)."""
_NONCE_BYTES = 12
_KEY_SIZES = (16, 24, 32)


@dataclass(frozen=True)
class EncryptionKey:
    """One AES-GCM key and its id."""

    id: str
    cipher: AESGCM

    @classmethod
    def parse(cls, spec: str) -> EncryptionKey:
        """A key from `[id:]base64`; the message never contains the key itself.

        Raises:
            CodecKeyError: Not base64 of 16, 24 or 32 bytes, or a bad id.
        """
        key_id, sep, encoded = spec.strip().rpartition(":")
        try:
            raw = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise CodecKeyError("an encryption key must be base64 ([id:]base64)") from None
        if len(raw) not in _KEY_SIZES:
            raise CodecKeyError(f"an encryption key must be 16, 24 or 32 bytes, got {len(raw)}")
        if sep and not key_id.replace("-", "").replace("_", "").isalnum():
            raise CodecKeyError("an encryption key id may hold letters, digits, '-' and '_' only")
        return cls(id=key_id if sep else hashlib.sha256(raw).hexdigest()[:8], cipher=AESGCM(raw))


def generate_key() -> str:
    """A fresh random 256-bit key, base64 (for GYMFLOW_ENCRYPTION_KEY)."""
    return base64.b64encode(os.urandom(32)).decode()


class EncryptionCodec(PayloadCodec):
    """AES-GCM over whole serialized payloads; the first key encrypts, every key decrypts.

    Payloads that are not encrypted (written before encryption was turned on) decode unchanged, so
    turning encryption on never makes old rollouts unreadable.
    """

    def __init__(self, keys: Sequence[EncryptionKey]) -> None:
        if not keys:
            raise CodecKeyError("the encryption codec needs at least one key")
        self._current = keys[0]
        self._keys = {key.id: key for key in keys}
        if len(self._keys) != len(keys):
            raise CodecKeyError("two encryption keys have the same id")

    @classmethod
    def from_specs(cls, current: str, previous: str | None = None) -> EncryptionCodec:
        """The codec of `current` (`[id:]base64`) plus comma-separated `previous` keys."""
        specs = [current, *[s for s in (previous or "").split(",") if s.strip()]]
        return cls([EncryptionKey.parse(s) for s in specs])

    @property
    def key_id(self) -> str:
        """Id of the key new payloads are encrypted with."""
        return self._current.id

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self._encrypt(p) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self._decrypt(p) for p in payloads]

    def _encrypt(self, payload: Payload) -> Payload:
        key = self._current
        nonce = os.urandom(_NONCE_BYTES)
        # The key id is authenticated data: a payload relabelled with another key id fails.
        sealed = key.cipher.encrypt(nonce, payload.SerializeToString(), key.id.encode())
        return Payload(metadata={"encoding": ENCODING, KEY_ID: key.id.encode()}, data=nonce + sealed)

    def _decrypt(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCODING:
            return payload
        key_id = payload.metadata.get(KEY_ID, b"").decode(errors="replace")
        key = self._keys.get(key_id)
        if key is None:
            raise CodecKeyError(
                f"payload encrypted with key {key_id!r}, which this process does not have "
                "(add it to GYMFLOW_DECRYPTION_KEYS)"
            )
        data = payload.data
        try:
            plain = key.cipher.decrypt(data[:_NONCE_BYTES], data[_NONCE_BYTES:], key_id.encode())
        except InvalidTag:
            raise CodecKeyError(f"payload does not decrypt with key {key_id!r} (tampered or wrong key)") from None
        return Payload.FromString(plain)


SESSION_COOKIE = "gymflow_codec_session"
SESSION_SECONDS = 7 * 24 * 3600
_LOGIN_PAGE = """<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>gymflow codec server</title></head>
<body style="font-family: system-ui, sans-serif; max-width: 40em; margin: 3em auto">
<h1>gymflow codec server</h1><p>{message}</p>
<form method="post" action="login"><label>Codec auth value (GYMFLOW_CODEC_AUTH)
<input type="password" name="auth" autocomplete="off" autofocus></label> <button type="submit">Log in</button></form>
<p>Then, in the Temporal Web UI's codec server settings, turn on <b>Include cross-origin credentials</b>.</p>
</body></html>"""


def session_token(authorization: str) -> str:
    """The browser session cookie's value for an auth value (an HMAC: the cookie never holds the value)."""
    return hmac.new(authorization.encode(), b"gymflow codec browser session", hashlib.sha256).hexdigest()


def codec_app(codec: PayloadCodec, *, origins: Sequence[str] = (), authorization: str | None = None) -> Starlette:
    """The codec server: `POST /encode` and `POST /decode` (also under `/{namespace}/`), `GET|POST /login`.

    Args:
        codec: The codec applied to each request's payloads.
        origins: Browser origins allowed to call it (the Web UI, e.g. `http://localhost:8233`).
        authorization: When set, requests must carry exactly this `Authorization` header value, or the
            session cookie `/login` sets for it.
    """
    session = session_token(authorization) if authorization is not None else None

    def allowed(request: Request) -> bool:
        if authorization is None or session is None:
            return True
        header = request.headers.get("authorization", "").encode()
        cookie = request.cookies.get(SESSION_COOKIE, "").encode()
        return hmac.compare_digest(header, authorization.encode()) or hmac.compare_digest(cookie, session.encode())

    async def login(request: Request) -> Response:
        if authorization is None or session is None:
            return HTMLResponse(_LOGIN_PAGE.format(message="This codec server requires no login."))
        if request.method == "GET":
            state = "You are logged in." if allowed(request) else "Log in to decode payloads in the Web UI."
            return HTMLResponse(_LOGIN_PAGE.format(message=state))
        form = await request.form()
        given = str(form.get("auth", "")).encode()
        if not hmac.compare_digest(given, authorization.encode()):
            return HTMLResponse(_LOGIN_PAGE.format(message="Wrong value; try again."), status_code=401)
        response = HTMLResponse(_LOGIN_PAGE.format(message="Logged in: the Web UI can now decode payloads."))
        response.set_cookie(
            SESSION_COOKIE, session, max_age=SESSION_SECONDS, httponly=True, samesite="strict", path="/"
        )
        return response

    def handler(encode: bool) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            if not allowed(request):
                return JSONResponse({"message": "unauthorized"}, status_code=401)
            try:
                payloads = json_format.Parse(await request.body(), Payloads())
            except (json_format.ParseError, UnicodeDecodeError) as exc:
                return JSONResponse({"message": f"body is not {{'payloads': [...]}}: {exc}"}, status_code=400)
            try:
                result = await (codec.encode if encode else codec.decode)(payloads.payloads)
            except CodecKeyError as exc:
                return JSONResponse({"message": str(exc)}, status_code=400)
            body = json_format.MessageToJson(Payloads(payloads=result))
            return Response(body, media_type="application/json")

        return endpoint

    routes = [Route("/login", login, methods=["GET", "POST"])]
    for prefix in ("", "/{namespace}"):
        routes.append(Route(f"{prefix}/encode", handler(True), methods=["POST"]))
        routes.append(Route(f"{prefix}/decode", handler(False), methods=["POST"]))
    cors = Middleware(
        CORSMiddleware,
        allow_origins=list(origins),
        allow_methods=["POST"],
        allow_headers=["content-type", "x-namespace", "authorization"],
        allow_credentials=True,
    )
    return Starlette(routes=routes, middleware=[cors])
