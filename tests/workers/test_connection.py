"""Which cluster a gymflow process dials: flags over GYMFLOW_* over TEMPORAL_* and profiles over the default.

Resolution is read from real temporal.toml files and environments by temporalio.envconfig (the
SDK core's loader, the one the `temporal` CLI shares); nothing is dialed here (the TLS front tests
in test_cluster_tls.py do that).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gymflow.deploy import launcher
from gymflow.workers.config import Settings
from gymflow.workers.connection import (
    DEFAULT_ADDRESS,
    ConnectionConfigError,
    ConnectionOptions,
    explain,
    resolve,
)
from gymflow.workers.processes import child_environment

TOML = """
[profile.default]
address = "default-profile:7233"

[profile.prod]
address = "prod.example:7233"
namespace = "rl"
api_key = "profile-key"

[profile.mtls]
address = "mtls.example:7233"
namespace = "secure"
[profile.mtls.tls]
server_ca_cert_path = "/certs/ca.pem"
client_cert_path = "/certs/client.pem"
client_key_path = "/certs/client.key"
server_name = "temporal.internal"
"""


@pytest.fixture
def toml(tmp_path: Path) -> Path:
    path = tmp_path / "temporal.toml"
    path.write_text(TOML)
    return path


def test_nothing_configured_is_the_embedded_default(tmp_path: Path) -> None:
    connection = resolve(environ={"TEMPORAL_CONFIG_FILE": str(tmp_path / "absent.toml")})
    assert (connection.address, connection.namespace, connection.origin) == (DEFAULT_ADDRESS, "default", "default")
    assert connection.embedded and connection.local_dev and connection.tls is None and connection.api_key is None


def test_the_default_profile_and_temporal_variables_name_a_cluster(toml: Path) -> None:
    profile = resolve(environ={"TEMPORAL_CONFIG_FILE": str(toml)})
    assert profile.address == "default-profile:7233" and profile.origin == "profile 'default'"
    assert not profile.embedded and not profile.local_dev
    variable = resolve(environ={"TEMPORAL_CONFIG_FILE": str(toml), "TEMPORAL_ADDRESS": "env.example:7233"})
    assert variable.address == "env.example:7233" and variable.origin == "TEMPORAL_ADDRESS"


def test_precedence_flag_over_gymflow_over_temporal_over_profile(toml: Path) -> None:
    environ = {"TEMPORAL_CONFIG_FILE": str(toml), "TEMPORAL_PROFILE": "prod", "TEMPORAL_NAMESPACE": "from-env"}
    assert resolve(environ=environ).namespace == "from-env"  # TEMPORAL_* over the profile
    level2 = resolve(environ=environ, gymflow_address="gymflow.example:7233", gymflow_namespace="gym")
    assert (level2.address, level2.namespace, level2.origin) == (
        "gymflow.example:7233",
        "gym",
        "GYMFLOW_TEMPORAL_ADDRESS",
    )
    level1 = resolve(
        ConnectionOptions(address="flag.example:7233", namespace="flagged", api_key="flag-key"),
        environ=environ,
        gymflow_address="gymflow.example:7233",
        gymflow_namespace="gym",
    )
    assert (level1.address, level1.namespace, level1.origin) == ("flag.example:7233", "flagged", "--address")
    assert level1.api_key == "flag-key"
    assert resolve(environ=environ).api_key == "profile-key"


def test_an_api_key_turns_tls_on_and_never_shows(toml: Path) -> None:
    connection = resolve(ConnectionOptions(profile="prod", config_file=toml), environ={})
    assert connection.tls is not None  # a key is never sent in clear
    assert "profile-key" not in repr(connection) and "profile-key" not in connection.describe()
    assert connection.connect_kwargs()["api_key"] == "profile-key"
    off = resolve(ConnectionOptions(profile="prod", config_file=toml), environ={"TEMPORAL_TLS": "false"})
    assert off.tls is None  # unless TLS is explicitly off (a proxy on the same host that adds TLS)


def test_tls_options_merge_over_the_profile(toml: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine.pem"
    connection = resolve(ConnectionOptions(profile="mtls", config_file=toml, tls_cert_path=mine), environ={})
    assert connection.tls is not None
    assert connection.tls.client_cert == mine  # the flag
    assert connection.tls.client_private_key == Path("/certs/client.key")  # the profile
    assert connection.tls.server_name == "temporal.internal"
    assert "mTLS" in connection.describe()
    plain = resolve(ConnectionOptions(address="localhost:7233", tls=True), environ={})
    assert plain.tls is not None and not plain.local_dev


def test_an_unknown_profile_or_missing_file_is_a_clear_error(toml: Path, tmp_path: Path) -> None:
    with pytest.raises(ConnectionConfigError, match="Profile 'staging' not found"):
        resolve(ConnectionOptions(profile="staging", config_file=toml), environ={})
    with pytest.raises(ConnectionConfigError, match="no such file"):
        resolve(ConnectionOptions(config_file=tmp_path / "nope.toml"), environ={})


def test_an_unreadable_tls_file_is_named(tmp_path: Path) -> None:
    connection = resolve(ConnectionOptions(tls_ca_path=tmp_path / "missing-ca.pem"), environ={})
    with pytest.raises(ConnectionConfigError, match=r"missing-ca\.pem"):
        connection.connect_kwargs()
    half = resolve(ConnectionOptions(tls_cert_path=tmp_path / "c.pem"), environ={})
    (tmp_path / "c.pem").write_text("cert")
    with pytest.raises(ConnectionConfigError, match="no client key"):
        half.connect_kwargs()


def test_settings_resolve_with_gymflow_variables_only_when_set(
    toml: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(toml))
    monkeypatch.setenv("TEMPORAL_PROFILE", "prod")
    monkeypatch.delenv("GYMFLOW_TEMPORAL_ADDRESS", raising=False)
    monkeypatch.delenv("GYMFLOW_NAMESPACE", raising=False)
    assert Settings().temporal_connection().address == "prod.example:7233"  # the field's default does not count
    monkeypatch.setenv("GYMFLOW_TEMPORAL_ADDRESS", "gym.example:7233")
    assert Settings().temporal_connection().address == "gym.example:7233"
    flagged = Settings(connection=ConnectionOptions(address="flag.example:7233"))
    assert flagged.temporal_connection().address == "flag.example:7233"


def test_child_processes_resolve_the_same_connection(toml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A supervisor's worker processes get its connection, flags included, as variables."""
    monkeypatch.delenv("GYMFLOW_TEMPORAL_ADDRESS", raising=False)
    monkeypatch.delenv("GYMFLOW_NAMESPACE", raising=False)
    settings = Settings(connection=ConnectionOptions(profile="mtls", config_file=toml, api_key="k1"), metrics_port=9100)
    parent = settings.temporal_connection()
    env = child_environment(settings, node_id="n-p1", count=2, index=1)
    assert env["GYMFLOW_METRICS_PORT"] == "9101"
    child = resolve(
        environ=env, gymflow_address=env["GYMFLOW_TEMPORAL_ADDRESS"], gymflow_namespace=env["GYMFLOW_NAMESPACE"]
    )
    assert (child.address, child.namespace, child.api_key) == (parent.address, parent.namespace, "k1")
    assert child.tls is not None and parent.tls is not None
    assert (child.tls.client_cert, child.tls.server_name) == (parent.tls.client_cert, parent.tls.server_name)


def test_fleet_credentials_are_secrets_and_file_mounts_never_task_envs(toml: Path) -> None:
    connection = resolve(ConnectionOptions(profile="mtls", config_file=toml, api_key="fleet-key"), environ={})
    spec = launcher.FleetSpec(
        nodes=2, temporal_address=connection.address, task_queue="q", namespace=connection.namespace,
        connection=connection,
    )  # fmt: skip
    config = launcher.task_config(spec, environ={})
    assert config["secrets"] == {"TEMPORAL_API_KEY": "fleet-key"}
    assert config["file_mounts"] == {
        "~/.gymflow/tls/server_ca_cert.pem": "/certs/ca.pem",
        "~/.gymflow/tls/client_cert.pem": "/certs/client.pem",
        "~/.gymflow/tls/client_key.pem": "/certs/client.key",
    }
    assert config["envs"]["TEMPORAL_TLS_CLIENT_KEY_PATH"] == "~/.gymflow/tls/client_key.pem"
    assert config["envs"]["GYMFLOW_TEMPORAL_ADDRESS"] == "mtls.example:7233"
    assert "fleet-key" not in launcher.render(config)  # --dryrun redacts secrets


@pytest.mark.parametrize(
    ("core_error", "says"),
    [
        (
            "tonic::transport::Error(Transport, InconsistentKeys(KeyMismatch))",
            "does not belong to the client certificate",
        ),
        (
            "ConnectError(Custom { kind: InvalidData, error: InvalidCertificate(UnknownIssuer) })",
            "not signed by the CA",
        ),
        ("InvalidCertificate(NotValidForName)", "does not name"),
        ("received fatal alert: CertificateRequired", "refused no client certificate"),
        ('Status { code: Unauthenticated, message: "invalid API key" }', "refused the credentials"),
        ('GoAway(b"", FRAME_SIZE_ERROR, Library)', "expects TLS"),
        ('ConnectError("tcp connect error", Os { code: 111, kind: ConnectionRefused })', "no Temporal server at"),
    ],
)
def test_core_errors_become_sentences(core_error: str, says: str) -> None:
    tls = resolve(ConnectionOptions(address="h.example:7233", tls=True), environ={})
    plain = resolve(ConnectionOptions(address="h.example:7233"), environ={})
    connection = plain if says in ("expects TLS", "no Temporal server at") else tls
    text = explain(RuntimeError(f"Failed client connect: {core_error}"), connection)
    assert says in text and "h.example:7233" in text, text
