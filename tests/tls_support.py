"""A TLS front for the session dev server: a throwaway PKI and Debian's nginx proxying gRPC.

The Temporal dev server speaks plaintext gRPC and ignores API keys, so the cluster tests put
nginx in front of it, as a load balancer or ingress sits in front of a production frontend:

* `Pki.create` makes a certificate authority, a server certificate for localhost/127.0.0.1, a
  client certificate, and the wrong things a user can hold: another CA (and a client certificate
  it signed), and a private key that does not match the client certificate. Every certificate is
  X.509 v3 with the extensions rustls (the SDK core's TLS) insists on: basicConstraints,
  keyUsage, extendedKeyUsage, subjectAltName.
* `TlsFront` runs nginx on a free port with `grpc_pass` to the dev server: TLS only, or mTLS
  (`ssl_verify_client on`), or an API key check (the `authorization` header must be
  `Bearer <key>`, else a gRPC UNAUTHENTICATED trailer, as Temporal Cloud answers).

nginx runs as this user with every path (config, pid, logs, temp dirs) in the test's directory,
listening on loopback only; the fixture stops it and removes nothing else.
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

NGINX_INSTALL = "apt-get install nginx-light"
"""What installs the proxy the TLS tests need on a Debian machine."""


def nginx_binary() -> str | None:
    """The nginx binary (PATH, then Debian's /usr/sbin), None if not installed."""
    found = shutil.which("nginx")
    if found is None and Path("/usr/sbin/nginx").is_file():
        found = "/usr/sbin/nginx"
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return path


def _write_cert(cert: x509.Certificate, path: Path) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


@dataclass
class _Authority:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def create(cls, common: str) -> _Authority:
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common))
            .issuer_name(_name(common))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_key_usage(ca=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert)

    def issue(self, common: str, *, server: bool) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        names: list[x509.GeneralName] = [x509.DNSName(common)]
        if server:
            names += [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(ca=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        return key, cert


@dataclass(frozen=True)
class Pki:
    """Paths of a throwaway PKI (PEM files)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    """A CA that signed neither the server's nor the client's certificate."""
    other_client_cert: Path
    """A client certificate signed by `other_ca` (the server does not trust it)."""
    other_client_key: Path
    wrong_key: Path
    """A private key that does not belong to `client_cert`."""

    @classmethod
    def create(cls, directory: Path) -> Pki:
        directory.mkdir(parents=True, exist_ok=True)
        ca, other = _Authority.create("gymflow test CA"), _Authority.create("some other CA")
        server_key, server_cert = ca.issue("temporal.test", server=True)
        client_key, client_cert = ca.issue("gymflow-worker", server=False)
        other_key, other_cert = other.issue("gymflow-worker", server=False)
        return cls(
            ca=_write_cert(ca.cert, directory / "ca.pem"),
            server_cert=_write_cert(server_cert, directory / "server.pem"),
            server_key=_write_key(server_key, directory / "server.key"),
            client_cert=_write_cert(client_cert, directory / "client.pem"),
            client_key=_write_key(client_key, directory / "client.key"),
            other_ca=_write_cert(other.cert, directory / "other-ca.pem"),
            other_client_cert=_write_cert(other_cert, directory / "other-client.pem"),
            other_client_key=_write_key(other_key, directory / "other-client.key"),
            wrong_key=_write_key(_key(), directory / "wrong.key"),
        )


_CONFIG = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    # Temporal long polls last ~70 s, payloads up to a few MB, workers keep many streams open.
    client_max_body_size 0;
    client_body_timeout 300s;
    keepalive_timeout 600s;
    http2_max_concurrent_streams 1000;
    server {{
        listen 127.0.0.1:{port} ssl http2;
        ssl_certificate {server_cert};
        ssl_certificate_key {server_key};
        ssl_protocols TLSv1.2 TLSv1.3;
        {client_auth}
        location / {{
            {api_key_check}
            grpc_pass grpc://{upstream};
            grpc_read_timeout 300s;
            grpc_send_timeout 300s;
        }}
        location @unauthenticated {{
            default_type application/grpc;
            add_header grpc-status 16 always;
            add_header grpc-message "invalid API key" always;
            return 200 "";
        }}
    }}
}}
"""


class TlsFront:
    """nginx terminating TLS (optionally mTLS, optionally an API key check) in front of `upstream`."""

    def __init__(
        self, directory: Path, *, upstream: str, pki: Pki, mtls: bool = False, api_key: str | None = None
    ) -> None:
        binary = nginx_binary()
        if binary is None:
            raise RuntimeError(f"nginx is not installed ({NGINX_INSTALL})")
        self.binary = binary
        self.dir = directory
        self.port = free_port()
        self.pki = pki
        client_auth = f"ssl_client_certificate {pki.ca};\n        ssl_verify_client on;" if mtls else ""
        check = (
            f'if ($http_authorization != "Bearer {api_key}") {{ return 418; }}\n            '
            "error_page 418 = @unauthenticated;"
            if api_key
            else ""
        )
        directory.mkdir(parents=True, exist_ok=True)
        self.config = directory / "nginx.conf"
        self.config.write_text(
            _CONFIG.format(
                dir=directory, port=self.port, upstream=upstream, server_cert=pki.server_cert,
                server_key=pki.server_key, client_auth=client_auth, api_key_check=check,
            )
        )  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        """host:port clients dial (the server certificate names localhost)."""
        return f"localhost:{self.port}"

    def start(self, timeout_s: float = 10.0) -> None:
        """Start nginx and wait until it accepts connections."""
        log = (self.dir / "stderr.log").open("ab")
        self.process = subprocess.Popen(
            [self.binary, "-c", str(self.config), "-p", str(self.dir), "-e", str(self.dir / "error.log")],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"nginx exited: {(self.dir / 'error.log').read_text(errors='replace')[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("nginx did not start listening") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGQUIT)  # graceful: finishes open streams, then exits
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
