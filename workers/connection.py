"""Which Temporal cluster a gymflow process dials, and how: `temporalio.envconfig`, as the `temporal` CLI.

Every command, worker, SDK client and the codec server resolve their connection here, field by
field (address, namespace, API key, TLS), highest first:

1. an explicit option: a CLI flag (`--address`, `--namespace`, `--profile`, `--config-file`,
   `--api-key`, `--tls`, `--tls-ca-path`, `--tls-cert-path`, `--tls-key-path`,
   `--tls-server-name`) or the same keyword of `gymflow.connect`;
2. gymflow's own variables, `GYMFLOW_TEMPORAL_ADDRESS` and `GYMFLOW_NAMESPACE` (address and
   namespace only: they predate profiles, and a deployment that sets them means them);
3. the standard client configuration every Temporal tool reads: `TEMPORAL_ADDRESS`,
   `TEMPORAL_NAMESPACE`, `TEMPORAL_API_KEY`, `TEMPORAL_TLS*`, `TEMPORAL_GRPC_META_*` over the
   profile (`TEMPORAL_PROFILE`, default `default`) of `temporal.toml` (`TEMPORAL_CONFIG_FILE`,
   default `~/.config/temporalio/temporal.toml`); envconfig merges these two;
4. the embedded default: `localhost:7233`, namespace `default`, plaintext.

An API key or any TLS setting turns TLS on (envconfig's rule). The embedded dev server is what
gymflow starts or registers search attributes on only when the connection is a plaintext one to
this machine (`Connection.local_dev`); any other cluster is only checked (gymflow.workers.servers.temporal).

A connection that cannot work fails at once with a `ConnectionFailed` (a `UserError`: one
`gymflow:` line) naming the cause and the setting to fix, never a hang or a retry loop: the
dial has a deadline (`CONNECT_TIMEOUT_S`), and the SDK core's error text (rustls, tonic, the
server's gRPC status) is turned into a sentence (`explain`). Secrets never appear in a message or
a `repr`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from temporalio.envconfig import ClientConfigProfile, ClientConfigTLS, DataSource
from temporalio.service import TLSConfig

from gymflow.envs.errors import ConnectionConfigError, ConnectionFailed

T = TypeVar("T")

DEFAULT_ADDRESS = "localhost:7233"
DEFAULT_NAMESPACE = "default"
CONNECT_TIMEOUT_S = 10.0
"""How long dialing a cluster (TCP, TLS handshake, the first RPC) may take before it is an error."""
LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost"})


@dataclass(frozen=True)
class ConnectionOptions:
    """Explicit connection options (level 1): CLI flags, or `gymflow.connect` keywords. None: not given."""

    address: str | None = None
    namespace: str | None = None
    profile: str | None = None
    """Profile of temporal.toml (else `TEMPORAL_PROFILE`, else `default`)."""
    config_file: Path | None = None
    """temporal.toml to read (else `TEMPORAL_CONFIG_FILE`, else the default location)."""
    api_key: str | None = field(default=None, repr=False)
    tls: bool | None = None
    """True: TLS with the system's roots unless a CA is given (also implied by any TLS option)."""
    tls_ca_path: Path | None = None
    tls_cert_path: Path | None = None
    tls_key_path: Path | None = None
    tls_server_name: str | None = None

    def any_tls(self) -> bool:
        return any(
            v is not None for v in (self.tls_ca_path, self.tls_cert_path, self.tls_key_path, self.tls_server_name)
        )


@dataclass(frozen=True)
class Connection:
    """A resolved connection: what `Client.connect` gets, and where each part came from."""

    address: str
    namespace: str
    origin: str
    """Where the address came from: `--address`, `GYMFLOW_TEMPORAL_ADDRESS`, `TEMPORAL_ADDRESS or
    profile 'x'`, or `default`."""
    api_key: str | None = field(default=None, repr=False)
    tls: ClientConfigTLS | None = None
    """None: plaintext."""
    grpc_meta: Mapping[str, str] = field(default_factory=dict, repr=False)
    profile: str | None = None
    config_file: str | None = None

    @property
    def host(self) -> str:
        host, _, _ = self.address.rpartition(":")
        return (host or self.address).strip("[]")

    @property
    def port(self) -> int:
        _, _, text = self.address.rpartition(":")
        return int(text) if text.isdigit() else 7233

    @property
    def loopback(self) -> bool:
        """The address names this machine."""
        if self.host in LOOPBACK_NAMES:
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    @property
    def local_dev(self) -> bool:
        """A plaintext connection to this machine: a dev server gymflow may start and set up itself."""
        return self.tls is None and self.api_key is None and self.loopback

    @property
    def embedded(self) -> bool:
        """Nothing named a cluster: the embedded dev server's default address."""
        return self.origin == "default"

    def describe(self) -> str:
        """`address (namespace ns, TLS/mTLS/API key; from ORIGIN)`, without any secret."""
        parts = [f"namespace {self.namespace}"]
        if self.tls is not None:
            parts.append("mTLS" if self.tls.client_cert is not None else "TLS")
        if self.api_key is not None:
            parts.append("API key")
        parts.append(f"from {self.origin}")
        return f"{self.address} ({', '.join(parts)})"

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `temporalio.client.Client.connect` (TLS files read now).

        Raises:
            ConnectionConfigError: A TLS file cannot be read.
        """
        kwargs: dict[str, Any] = {"target_host": self.address, "namespace": self.namespace}
        if self.api_key is not None:
            kwargs["api_key"] = self.api_key
        if self.tls is not None:
            kwargs["tls"] = _tls_config(self.tls)
        if self.grpc_meta:
            kwargs["rpc_metadata"] = dict(self.grpc_meta)
        return kwargs

    def environment(self) -> dict[str, str]:
        """`TEMPORAL_*` variables under which a child process resolves this same connection.

        Worker processes of a supervisor and trainers started by a worker get them (secrets
        included: a process environment, never a workflow input or a history).
        """
        env = {"TEMPORAL_ADDRESS": self.address, "TEMPORAL_NAMESPACE": self.namespace}
        if self.api_key is not None:
            env["TEMPORAL_API_KEY"] = self.api_key
        if self.tls is not None:
            env["TEMPORAL_TLS"] = "true"
            for name, source in (
                ("SERVER_CA_CERT", self.tls.server_root_ca_cert),
                ("CLIENT_CERT", self.tls.client_cert),
                ("CLIENT_KEY", self.tls.client_private_key),
            ):
                if isinstance(source, Path):
                    env[f"TEMPORAL_TLS_{name}_PATH"] = str(source.resolve())
                elif source is not None:
                    env[f"TEMPORAL_TLS_{name}_DATA"] = source.decode() if isinstance(source, bytes) else source
            if self.tls.server_name:
                env["TEMPORAL_TLS_SERVER_NAME"] = self.tls.server_name
        for key, value in self.grpc_meta.items():
            env[f"TEMPORAL_GRPC_META_{key.upper().replace('-', '_')}"] = value
        return env


def resolve(
    options: ConnectionOptions | None = None,
    *,
    gymflow_address: str | None = None,
    gymflow_namespace: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Connection:
    """Resolve the connection by the precedence of the module docstring.

    Args:
        options: Explicit options (level 1).
        gymflow_address: `GYMFLOW_TEMPORAL_ADDRESS` when it was set (level 2).
        gymflow_namespace: `GYMFLOW_NAMESPACE` when it was set (level 2).
        environ: The environment envconfig reads (default: this process's).

    Raises:
        ConnectionConfigError: The profile or config file named cannot be loaded.
    """
    options = options or ConnectionOptions()
    environ = os.environ if environ is None else environ
    profile = _load_profile(options, environ)
    profile_name = options.profile or environ.get("TEMPORAL_PROFILE") or None
    config_file = str(options.config_file) if options.config_file else environ.get("TEMPORAL_CONFIG_FILE")
    standard = "TEMPORAL_ADDRESS" if environ.get("TEMPORAL_ADDRESS") else f"profile {profile_name or 'default'!r}"

    address, origin = DEFAULT_ADDRESS, "default"
    for value, where in (
        (profile.address, standard),
        (gymflow_address, "GYMFLOW_TEMPORAL_ADDRESS"),
        (options.address, "--address"),
    ):
        if value:
            address, origin = value, where
    namespace = options.namespace or gymflow_namespace or profile.namespace or DEFAULT_NAMESPACE
    api_key = options.api_key if options.api_key is not None else profile.api_key
    return Connection(
        address=address,
        namespace=namespace,
        origin=origin,
        api_key=api_key or None,
        tls=_merge_tls(profile.tls, options, api_key=bool(api_key)),
        grpc_meta=dict(profile.grpc_meta),
        profile=profile_name,
        config_file=config_file,
    )


def _load_profile(options: ConnectionOptions, environ: Mapping[str, str]) -> ClientConfigProfile:
    source: DataSource | None = None
    if options.config_file is not None:
        if not options.config_file.is_file():
            raise ConnectionConfigError(f"--config-file {options.config_file}: no such file")
        source = options.config_file
    try:
        return ClientConfigProfile.load(profile=options.profile, config_source=source, override_env_vars=dict(environ))
    except Exception as exc:  # the core's envconfig raises plain RuntimeErrors for every problem
        file = options.config_file or environ.get("TEMPORAL_CONFIG_FILE") or "~/.config/temporalio/temporal.toml"
        raise ConnectionConfigError(f"cannot load the Temporal client configuration ({file}): {exc}") from None


def _merge_tls(
    profile_tls: ClientConfigTLS | None, options: ConnectionOptions, *, api_key: bool
) -> ClientConfigTLS | None:
    """The profile's TLS with the explicit options over it; None when TLS is off.

    On when an option asks for it, else when the profile / TEMPORAL_TLS* configure it (and do not
    disable it), else when there is an API key (envconfig's rule: a key is never sent in clear).
    """
    base = profile_tls or ClientConfigTLS()
    merged = dataclasses.replace(
        base,
        server_name=options.tls_server_name or base.server_name,
        server_root_ca_cert=options.tls_ca_path or base.server_root_ca_cert,
        client_cert=options.tls_cert_path or base.client_cert,
        client_private_key=options.tls_key_path or base.client_private_key,
    )
    if options.tls or options.any_tls():
        return dataclasses.replace(merged, disabled=False)
    if merged.disabled:
        return None
    return merged if profile_tls is not None or api_key else None


def _tls_config(tls: ClientConfigTLS) -> TLSConfig:
    def read(source: DataSource | None, what: str) -> bytes | None:
        if source is None:
            return None
        if isinstance(source, Path):
            try:
                return source.read_bytes()
            except OSError as exc:
                raise ConnectionConfigError(f"cannot read the {what} {source}: {exc.strerror}") from None
        return source.encode() if isinstance(source, str) else source

    cert = read(tls.client_cert, "TLS client certificate")
    key = read(tls.client_private_key, "TLS client key")
    if (cert is None) != (key is None):
        missing = (
            "key (--tls-key-path, TEMPORAL_TLS_CLIENT_KEY_PATH)"
            if key is None
            else ("certificate (--tls-cert-path, TEMPORAL_TLS_CLIENT_CERT_PATH)")
        )
        raise ConnectionConfigError(
            f"a TLS client certificate needs its key and the other way round: no client {missing}"
        )
    return TLSConfig(
        server_root_ca_cert=read(tls.server_root_ca_cert, "TLS server CA certificate"),
        domain=tls.server_name,
        client_cert=cert,
        client_private_key=key,
    )


# -- failures -------------------------------------------------------------------------------------
def _source_name(source: DataSource | None, flag: str, variable: str) -> str:
    if isinstance(source, Path):
        return str(source)
    if source is not None:
        return f"the inline data of {variable.replace('_PATH', '_DATA')}"
    return f"none given ({flag}, {variable})"


def explain(error: BaseException, connection: Connection) -> str:
    """One sentence for a failed dial: what went wrong, in the user's terms, and what to change."""
    text = str(error)
    where = connection.describe()
    tls = connection.tls
    ca = _source_name(tls.server_root_ca_cert if tls else None, "--tls-ca-path", "TEMPORAL_TLS_SERVER_CA_CERT_PATH")
    cert = _source_name(tls.client_cert if tls else None, "--tls-cert-path", "TEMPORAL_TLS_CLIENT_CERT_PATH")
    key = _source_name(tls.client_private_key if tls else None, "--tls-key-path", "TEMPORAL_TLS_CLIENT_KEY_PATH")
    if "KeyMismatch" in text or "InconsistentKeys" in text:
        return (
            f"cannot connect to {where}: the TLS client key ({key}) does not belong to the client certificate ({cert})"
        )
    if "UnknownIssuer" in text or "BadSignature" in text or "invalid peer certificate" in text:
        return (
            f"cannot connect to {where}: the server's certificate is not signed by the CA this client trusts "
            f"(server CA: {ca}); point --tls-ca-path / TEMPORAL_TLS_SERVER_CA_CERT_PATH at the CA that signed it"
        )
    if "NotValidForName" in text:
        return (
            f"cannot connect to {where}: the server's certificate does not name {connection.host}; "
            "set --tls-server-name / TEMPORAL_TLS_SERVER_NAME to a name it carries"
        )
    if "Expired" in text or "NotValidYet" in text:
        return f"cannot connect to {where}: a TLS certificate is expired or not yet valid ({_core_detail(text)})"
    refused_cert = any(
        s in text for s in ("CertificateRequired", "UnknownCA", "BadCertificate", "DecryptError", "AccessDenied")
    )
    if refused_cert or (tls is not None and "400 Bad Request" in text):
        sent = (
            f"the client certificate {cert}"
            if tls is not None and tls.client_cert is not None
            else "no client certificate"
        )
        return (
            f"cannot connect to {where}: the server refused {sent} (mutual TLS): give a certificate and key "
            "signed by a CA the server trusts (--tls-cert-path/--tls-key-path, TEMPORAL_TLS_CLIENT_CERT_PATH/"
            "TEMPORAL_TLS_CLIENT_KEY_PATH, or the profile's tls section)"
        )
    if "Unauthenticated" in text or "PermissionDenied" in text:
        status = "UNAUTHENTICATED" if "Unauthenticated" in text else "PERMISSION_DENIED"
        if connection.api_key is None:
            fix = "this client sent no API key: set TEMPORAL_API_KEY (or the profile's api_key, or --api-key)"
        else:
            fix = "check the API key (TEMPORAL_API_KEY, the profile's api_key or --api-key) and its namespace access"
        return f"cannot connect to {where}: the server refused the credentials ({status}: {_message(text)}); {fix}"
    if tls is None and any(s in text for s in ("FRAME_SIZE_ERROR", "http2 error", "frame with invalid size")):
        return (
            f"cannot connect to {where}: the server expects TLS and this client spoke plaintext; enable TLS "
            "(--tls, TEMPORAL_TLS=true, or a tls section in the profile)"
        )
    if tls is None and "connection closed" in text:  # what a TLS listener does to a plaintext HTTP/2 preface
        return (
            f"cannot connect to {where}: the server closed the connection at once; it probably expects TLS: "
            "enable TLS (--tls, TEMPORAL_TLS=true, or a tls section in the profile)"
        )
    if tls is not None and ("InvalidContentType" in text or "CorruptMessage" in text or "InvalidMessage" in text):
        return (
            f"cannot connect to {where}: TLS is on but the server does not speak TLS; turn it off "
            "(TEMPORAL_TLS=false) or use the server's TLS port"
        )
    if "Connection refused" in text or "ConnectionRefused" in text:
        hint = (
            "start one with `gymflow server`, or point --address / TEMPORAL_ADDRESS (or a profile) at yours"
            if connection.local_dev
            else "check the address and that the server is up"
        )
        return f"no Temporal server at {where}: {hint}"
    if "dns error" in text or "failed to lookup address" in text:
        return f"cannot connect to {where}: the host name {connection.host!r} does not resolve"
    return f"cannot connect to {where}: {_core_detail(text)}"


def _message(text: str) -> str:
    start = text.find('message: "')
    if start < 0:
        return _core_detail(text)
    start += len('message: "')
    return text[start : text.find('"', start)]


def _core_detail(text: str) -> str:
    return text.removeprefix("Failed client connect: ").strip()[:300]


async def dial(
    connection: Connection, attempt: Callable[[], Awaitable[T]], *, timeout_s: float = CONNECT_TIMEOUT_S
) -> T:
    """`attempt()` (a connect) within `timeout_s`; any failure becomes a `ConnectionFailed` that says why.

    Raises:
        ConnectionFailed: The dial failed or did not finish in time.
        ConnectionConfigError: A TLS file cannot be read.
    """
    try:
        return await asyncio.wait_for(attempt(), timeout_s)
    except TimeoutError:
        raise ConnectionFailed(
            f"cannot connect to {connection.describe()}: no answer within {timeout_s:g} s "
            "(a wrong address, or a firewall or network partition on the way)"
        ) from None
    except RuntimeError as exc:  # the SDK's "Failed client connect: ..."
        raise ConnectionFailed(explain(exc, connection)) from None
