"""gymflow on a secured cluster: the session dev server behind nginx terminating TLS, as a load balancer would.

Two fronts (tests/tls_support.py): one requires client certificates (mTLS), the other an API key
(`authorization: Bearer <key>`, else gRPC UNAUTHENTICATED, as Temporal Cloud answers). Through
them, configured the way every Temporal tool is (a temporal.toml profile, or TEMPORAL_* variables):
the SDK and an in-process worker run a rollout; the console script's `gymflow worker` and `gymflow
eval` run a batch and `temporal workflow list` finds its rollouts (slow: three processes); and
every wrong certificate, key or API key fails fast, naming the cause, through the SDK, a command
and a worker. A namespace without gymflow's search attributes is refused at connect, saying how
to add them, until `gymflow server setup` has added them.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import leaks
import pytest
from google.protobuf.duration_pb2 import Duration
from mcp_support import wait_polling
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
from temporalio.client import Client
from tls_support import NGINX_INSTALL, Pki, TlsFront, nginx_binary

import gymflow
from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RolloutInput
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.errors import ConnectionFailed, MissingSearchAttributes
from gymflow.workers.cli.main import main
from gymflow.workers.sdk.client import run_rollout
from gymflow.workers.servers.temporal import temporal_binary
from gymflow.workers.worker import running_worker
from support import make_settings

ROOT = Path(__file__).parents[2]
GYMFLOW = Path(sys.executable).parent / "gymflow"
API_KEY = f"gymflow-test-key-{uuid.uuid4().hex[:12]}"
leaks.register(API_KEY)  # the session's history scan: an API key never enters a history
FAST_S = 5.0
"""A wrong credential must fail within this, inside the client (the issue's bound)."""
COMMAND_S = 15.0
"""... and a whole `gymflow` command, interpreter start included, within this on a loaded 2-core box."""

pytestmark = pytest.mark.skipif(nginx_binary() is None, reason=f"nginx is not installed: {NGINX_INSTALL}")


@dataclass(frozen=True)
class Fronts:
    pki: Pki
    mtls: TlsFront
    api_key: TlsFront
    toml: Path
    """temporal.toml with profiles `mtls` and `apikey` (and broken variants) for these fronts."""


def _profiles(pki: Pki, mtls: str, keyed: str) -> str:
    def tls(ca: Path, cert: Path | None = None, key: Path | None = None) -> str:
        lines = [f'server_ca_cert_path = "{ca}"']
        if cert is not None:
            lines += [f'client_cert_path = "{cert}"', f'client_key_path = "{key}"']
        return "\n".join(lines)

    profiles = {
        "mtls": (mtls, "", tls(pki.ca, pki.client_cert, pki.client_key)),
        "wrong-ca": (mtls, "", tls(pki.other_ca, pki.client_cert, pki.client_key)),
        "wrong-cert": (mtls, "", tls(pki.ca, pki.other_client_cert, pki.other_client_key)),
        "wrong-key": (mtls, "", tls(pki.ca, pki.client_cert, pki.wrong_key)),
        "no-cert": (mtls, "", tls(pki.ca)),
        "apikey": (keyed, f'api_key = "{API_KEY}"', tls(pki.ca)),
        "wrong-apikey": (keyed, 'api_key = "not-the-key"', tls(pki.ca)),
        "no-apikey": (keyed, "", tls(pki.ca)),
    }
    return "\n".join(
        f'[profile.{name}]\naddress = "{address}"\n{extra}\n[profile.{name}.tls]\n{tls_lines}\n'
        for name, (address, extra, tls_lines) in profiles.items()
    )


@pytest.fixture(scope="module")
def fronts(temporal_address: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fronts]:
    base = tmp_path_factory.mktemp("tls")
    pki = Pki.create(base / "pki")
    mtls = TlsFront(base / "nginx-mtls", upstream=temporal_address, pki=pki, mtls=True)
    keyed = TlsFront(base / "nginx-apikey", upstream=temporal_address, pki=pki, api_key=API_KEY)
    toml = base / "temporal.toml"
    toml.write_text(_profiles(pki, mtls.address, keyed.address))
    mtls.start()
    try:
        keyed.start()
        try:
            yield Fronts(pki, mtls, keyed, toml)
        finally:
            keyed.stop()
    finally:
        mtls.stop()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No GYMFLOW_/TEMPORAL_ connection variables from the caller's shell."""
    for name in list(os.environ):
        if name.startswith("TEMPORAL_") or name in ("GYMFLOW_TEMPORAL_ADDRESS", "GYMFLOW_NAMESPACE"):
            monkeypatch.delenv(name)


async def test_sdk_and_a_worker_run_a_rollout_through_an_mtls_profile(
    fronts: Fronts, clean_env: None, calculator_policy_url: str, tmp_path: Path
) -> None:
    client = await gymflow.connect(profile="mtls", config_file=fronts.toml)
    assert client.service_client.config.target_host == fronts.mtls.address
    settings = make_settings(tmp_path)
    async with running_worker(client, settings):
        result = await run_rollout(
            client,
            RolloutInput(
                env="math",
                task=generate_tasks(1, seed=29)[0],
                model=ModelConfig(base_url=calculator_policy_url),
            ),
            task_queue=settings.task_queue,
        )
    assert result.reward is not None and result.reward.total == 1.0, result


async def test_temporal_variables_with_an_api_key(
    fronts: Fronts, clean_env: None, monkeypatch: pytest.MonkeyPatch, calculator_policy_url: str, tmp_path: Path
) -> None:
    monkeypatch.setenv("TEMPORAL_ADDRESS", fronts.api_key.address)
    monkeypatch.setenv("TEMPORAL_API_KEY", API_KEY)
    monkeypatch.setenv("TEMPORAL_TLS_SERVER_CA_CERT_PATH", str(fronts.pki.ca))
    keyed = await gymflow.connect()
    assert keyed.service_client.config.target_host == fronts.api_key.address
    settings = make_settings(tmp_path)
    async with running_worker(keyed, settings):  # every poll and completion carries the key
        result = await run_rollout(
            keyed,
            RolloutInput(
                env="math", task=generate_tasks(1, seed=30)[0], model=ModelConfig(base_url=calculator_policy_url)
            ),
            task_queue=settings.task_queue,
        )
    assert result.reward is not None and result.reward.total == 1.0, result


@pytest.mark.parametrize(
    ("profile", "says"),
    [
        ("wrong-ca", "not signed by the CA"),
        ("wrong-cert", "refused the client certificate"),
        ("no-cert", "refused no client certificate"),
        ("wrong-key", "does not belong to the client certificate"),
        ("wrong-apikey", "refused the credentials (UNAUTHENTICATED"),
        ("no-apikey", "sent no API key"),
    ],
)
async def test_a_wrong_credential_fails_fast_naming_the_cause(
    fronts: Fronts, clean_env: None, profile: str, says: str
) -> None:
    started = time.monotonic()
    with pytest.raises(ConnectionFailed) as caught:
        await gymflow.connect(profile=profile, config_file=fronts.toml)
    elapsed = time.monotonic() - started
    assert says in str(caught.value), caught.value
    assert elapsed < FAST_S, f"{profile}: {elapsed:.1f} s"
    assert API_KEY not in str(caught.value) and "not-the-key" not in str(caught.value)


async def test_plaintext_to_a_tls_front_says_to_turn_tls_on(fronts: Fronts, clean_env: None) -> None:
    with pytest.raises(ConnectionFailed, match="expects TLS"):
        await gymflow.connect(fronts.mtls.address)


async def run_gymflow(*args: str, env: dict[str, str], timeout_s: float = 120) -> tuple[int, str, str, float]:
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        str(GYMFLOW), *args, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout_s)
    return process.returncode or 0, out.decode(), err.decode(), time.monotonic() - started


def _base_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
    env.pop("GYMFLOW_TEMPORAL_ADDRESS", None)
    env.pop("GYMFLOW_NAMESPACE", None)
    return {**env, "GYMFLOW_DATA_DIR": str(tmp_path / "data"), "GYMFLOW_WORKSPACE_ROOT": str(tmp_path / "ws")}


@pytest.mark.slow  # two interpreters starting (the SDK-level checks above run by default)
@pytest.mark.parametrize("command", ["status", "worker"])
async def test_commands_and_the_worker_end_with_one_line_on_a_wrong_key(
    fronts: Fronts, tmp_path: Path, command: str
) -> None:
    env = {**_base_env(tmp_path), "TEMPORAL_CONFIG_FILE": str(fronts.toml)}
    code, _, err, elapsed = await run_gymflow(command, "--profile", "wrong-key", env=env, timeout_s=60)
    last = err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("gymflow") and "does not belong to the client certificate" in last, err
    assert "Traceback" not in err and elapsed < COMMAND_S, (elapsed, err)


async def test_a_namespace_without_search_attributes_is_refused_until_setup(
    fronts: Fronts, clean_env: None, client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    namespace = f"bare-{uuid.uuid4().hex[:8]}"
    await client.workflow_service.register_namespace(
        RegisterNamespaceRequest(namespace=namespace, workflow_execution_retention_period=Duration(seconds=86400))
    )
    with pytest.raises(MissingSearchAttributes) as caught:
        await gymflow.connect(profile="mtls", config_file=fronts.toml, namespace=namespace)
    message = str(caught.value)
    assert "GymflowEnv" in message and "gymflow server setup --profile mtls" in message
    assert "temporal operator search-attribute create" in message and "tcld namespace search-attributes add" in message
    setup = ["server", "setup", "--profile", "mtls", "--config-file", str(fronts.toml), "--namespace", namespace]
    assert await asyncio.to_thread(main, setup) == 0  # the command, in this process (it runs its own loop)
    assert "registered GymflowEnv" in capsys.readouterr().err
    connected = await gymflow.connect(profile="mtls", config_file=fronts.toml, namespace=namespace)
    assert connected.namespace == namespace
    assert await asyncio.to_thread(main, setup) == 0
    assert "already" in capsys.readouterr().err


@pytest.mark.slow
async def test_eval_a_worker_and_the_temporal_cli_through_profiles_and_variables(
    fronts: Fronts, client: Client, calculator_policy_url: str, tmp_path: Path
) -> None:
    """The console scripts as users run them: a `gymflow worker` dialing by a temporal.toml profile
    (mTLS), `gymflow eval --no-worker` by TEMPORAL_* variables (an API key), `temporal workflow list`
    by the profile."""
    queue = f"tls-{uuid.uuid4().hex[:8]}"
    node = f"tls-node-{uuid.uuid4().hex[:6]}"
    base = {**_base_env(tmp_path), "GYMFLOW_TASK_QUEUE": queue}
    worker_env = {**base, "TEMPORAL_CONFIG_FILE": str(fronts.toml), "TEMPORAL_PROFILE": "mtls", "GYMFLOW_NODE_ID": node}
    log = (tmp_path / "worker.log").open("wb")
    worker = await asyncio.create_subprocess_exec(
        str(GYMFLOW), "worker", cwd=ROOT, env=worker_env, stdout=log, stderr=asyncio.subprocess.STDOUT
    )
    log.close()
    try:
        await wait_polling(client, [f"{queue}@{node}"])
        eval_env = {
            **base,
            "TEMPORAL_ADDRESS": fronts.api_key.address,
            "TEMPORAL_API_KEY": API_KEY,
            "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(fronts.pki.ca),
        }
        args = ("eval", "math", "--n", "4", "--no-worker", "--policy", calculator_policy_url, "--reps", "100", "--json")
        code, out, err, _ = await run_gymflow(*args, env=eval_env, timeout_s=300)
        assert code == 0, err[-3000:]
        batch = json.loads(out)["batches"][0]["batch_id"]
        query = f'GymflowBatch="{batch}" AND WorkflowType="RolloutWorkflow"'
        deadline = time.monotonic() + 30
        while True:  # visibility is eventually consistent
            listed = await asyncio.create_subprocess_exec(
                temporal_binary(), "workflow", "list", "--config-file", str(fronts.toml), "--profile", "mtls",
                "--query", query, "--output", "json",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            stdout, stderr = await asyncio.wait_for(listed.communicate(), 60)
            assert listed.returncode == 0, stderr.decode()
            rollouts = json.loads(stdout or b"[]")
            if len(rollouts) == 4 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        assert len(rollouts) == 4, stdout.decode()[-2000:]
    finally:
        worker.terminate()
        await asyncio.wait_for(worker.wait(), 60)
    assert worker.returncode == 0, (tmp_path / "worker.log").read_text()[-3000:]
