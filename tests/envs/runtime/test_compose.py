"""The compose parser (gymflow.envs.runtime.compose): pure, no engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from gymflow.envs.errors import ComposeError
from gymflow.envs.runtime.compose import MAIN_SERVICE, Condition, load, parse
from gymflow.envs.runtime.compose_values import interpolate, parse_bytes, parse_duration


@pytest.fixture
def env_dir(tmp_path: Path) -> Path:
    (tmp_path / "Dockerfile").write_text("FROM debian:bookworm-slim\n")
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "Dockerfile.db").write_text("FROM debian:bookworm-slim\n")
    return tmp_path


HARBOR_LIKE = """
x-common: &common
  environment:
    SHARED: "1"
services:
  main:
    depends_on:
      db:
        condition: service_healthy
      init:
        condition: service_completed_successfully
    environment:
      - DB_HOST=db
      - TEST_DIR=${TEST_DIR:-/tests}
  db:
    build:
      context: ./db
      dockerfile: Dockerfile.db
    command: postgres -c 'max_connections=50'
    environment:
      POSTGRES_PASSWORD: ${PASSWORD}
      FLAG: true
    healthcheck:
      test: ["CMD-SHELL", "pg_isready -U postgres"]
      interval: 1s
      timeout: 500ms
      retries: 10
      start_period: 1m30s
    mem_limit: 256m
    cpus: "0.5"
    networks:
      default:
        aliases: [database]
    volumes:
      - dbdata:/var/lib/postgresql/data
  init:
    image: debian:bookworm-slim
    entrypoint: ["sh", "-c"]
    command: ["echo done"]
    depends_on: [db]
    deploy:
      resources:
        limits: {cpus: "0.25", memory: 1g}
volumes:
  dbdata:
"""


def test_harbor_like_file(env_dir: Path) -> None:
    (env_dir / "docker-compose.yaml").write_text(HARBOR_LIKE)
    project = load(env_dir / "docker-compose.yaml", variables={"PASSWORD": "secret"})
    assert project.main == MAIN_SERVICE
    main = project.main_service
    assert main.build is not None and main.build.context == env_dir.resolve()  # Harbor's base: built from '.'
    assert main.environment == {"DB_HOST": "db", "TEST_DIR": "/tests"}
    assert main.depends_on == {"db": Condition.HEALTHY, "init": Condition.COMPLETED}
    db = project.services["db"]
    assert db.build is not None and db.build.dockerfile == (env_dir / "db" / "Dockerfile.db").resolve()
    assert db.command == ["postgres", "-c", "max_connections=50"]
    assert db.environment == {"POSTGRES_PASSWORD": "secret", "FLAG": "true"}
    assert db.healthcheck is not None
    assert db.healthcheck.test == ["/bin/sh", "-c", "pg_isready -U postgres"]
    assert (db.healthcheck.interval_s, db.healthcheck.timeout_s, db.healthcheck.retries) == (1.0, 0.5, 10)
    assert db.healthcheck.start_period_s == 90.0
    assert (db.limits.cpus, db.limits.memory_bytes) == (0.5, 256 * 1024**2)
    init = project.services["init"]
    assert (init.entrypoint, init.command) == (["sh", "-c"], ["echo done"])
    assert (init.limits.cpus, init.limits.memory_bytes) == (0.25, 1024**3)
    assert project.order.index("db") < project.order.index("init") < project.order.index("main")
    assert [s.name for s in project.sidecars()] == ["db", "init"]


def test_main_implied_or_from_dot(env_dir: Path) -> None:
    implied = parse("services:\n  db:\n    image: x\n", base_dir=env_dir, variables={})
    assert implied.main == "main" and implied.main_service.build is not None
    assert implied.order == ["db", "main"]
    named = parse("services:\n  app:\n    build: .\n  db:\n    image: x\n", base_dir=env_dir, variables={})
    assert named.main == "app"


@pytest.mark.parametrize(
    ("service_yaml", "named"),
    [
        ("ports: ['8080:80']", "'ports'"),
        ("volumes: ['/etc:/host-etc']", "mounts from the host"),
        ("volumes: ['./data:/data']", "mounts from the host"),
        ("privileged: true", "'privileged'"),
        ("network_mode: host", "'network_mode'"),
        ("cap_add: [NET_ADMIN]", "'cap_add'"),
        ("devices: ['/dev/kvm']", "'devices'"),
        ("pid: host", "'pid'"),
        ("ipc: host", "'ipc'"),
        ("extra_hosts: ['a:1.2.3.4']", "'extra_hosts'"),
        ("deploy: {replicas: 3}", "deploy"),
        ("restart: always", "isolation rules"),
        ("healthcheck: {test: [WHAT, x]}", "healthcheck"),
        ("depends_on: {main: {condition: service_exploded}}", "unknown condition"),
    ],
)
def test_refused_keys_name_service_and_key(env_dir: Path, service_yaml: str, named: str) -> None:
    text = f"services:\n  main:\n    build: .\n  db:\n    image: x\n    {service_yaml}\n"
    with pytest.raises(ComposeError) as caught:
        parse(text, base_dir=env_dir, variables={})
    assert "'db'" in str(caught.value) and named in str(caught.value)


def test_structural_errors(env_dir: Path) -> None:
    cases = {
        "services:\n  a: {image: x, depends_on: [b]}\n  b: {image: x, depends_on: [a]}\n": "cycle: a -> b -> a",
        "services:\n  a:\n    image: x\n    depends_on: [nope]\n": "'nope': no such service",
        "services:\n  a:\n    image: x\n  b:\n    image: x\n    depends_on: {a: {condition: service_healthy}}\n": (
            "'a' has no healthcheck"
        ),
        "services:\n  a: {image: x, volumes: [v:/x]}\n  b: {image: x, volumes: [v:/y]}\n": "shared by a, b",
        "services: {}\n": "at least one service",
        "secrets: {}\nservices:\n  a: {image: x}\n": "'secrets'",
        "services:\n  a: {image: '${UNSET}'}\n": "UNSET is not set",
        "services:\n  a: {build: ./missing}\n": "not a directory",
    }
    for text, message in cases.items():
        with pytest.raises(ComposeError, match=message):
            parse(text, base_dir=env_dir, variables={})


def test_interpolation() -> None:
    variables = {"A": "x", "EMPTY": ""}
    assert interpolate("${A}-$A-$$A-${B:-dflt}-${EMPTY:-d}-${EMPTY-d}-${B-a}", variables) == "x-x-$A-dflt-d--a"
    with pytest.raises(ComposeError, match="needed here"):
        interpolate("${B:?needed here}", variables)
    with pytest.raises(ComposeError, match="unterminated"):
        interpolate("${A", variables)


def test_durations_and_sizes() -> None:
    assert parse_duration("1m30s", where="t") == 90
    assert parse_duration("500ms", where="t") == 0.5
    assert parse_duration("1h2m3s", where="t") == 3723
    assert parse_duration(5, where="t") == 5
    for bad in ("", "10", "5x", "1m30"):
        with pytest.raises(ComposeError, match="not a duration"):
            parse_duration(bad, where="t")
    assert parse_bytes("512m", where="t") == 512 * 1024**2
    assert parse_bytes("1GB", where="t") == 1024**3
    assert parse_bytes(1000, where="t") == 1000
    with pytest.raises(ComposeError, match="memory size"):
        parse_bytes("lots", where="t")


def test_healthcheck_forms(env_dir: Path) -> None:
    text = """
services:
  main: {build: .}
  a: {image: x, healthcheck: {test: "exit 0"}, restart: no}
  b: {image: x, healthcheck: {test: [CMD, pg_isready, -q]}}
  c: {image: x, healthcheck: {test: [NONE]}}
  d: {image: x, healthcheck: {disable: true}}
"""
    services = parse(text, base_dir=env_dir, variables={}).services
    assert services["a"].healthcheck is not None and services["a"].healthcheck.test == ["/bin/sh", "-c", "exit 0"]
    assert services["a"].healthcheck.interval_s == 30 and services["a"].healthcheck.retries == 3
    assert services["b"].healthcheck is not None and services["b"].healthcheck.test == ["pg_isready", "-q"]
    assert services["c"].healthcheck is None and services["d"].healthcheck is None
