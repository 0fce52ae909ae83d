"""Connecting to Temporal with gymflow's data converter: the one client of worker, CLI, SDK and tests.

The data converter is temporalio's pydantic converter with two changes. A payload that fails
validation (say, `temporal workflow start --input` JSON with a missing field) raises a
non-retryable `ApplicationError(type="InvalidInput")` naming the field. Raised while decoding a
workflow's input, that fails the workflow at once instead of failing its workflow task forever.
And the payloads every turn of a rollout carries (`Wire.compact_json`: activity inputs and
results, the rollout's input) are written without the fields that hold their defaults
(`"tool_calls": []`, `"is_error": false`, `"token_prefix": null`, ...): decoding fills them in
again, so the values are the same, and a rollout's history, what the Temporal server stores and
sends for every workflow task, is smaller. Results people read as raw
JSON (the trajectory, a group's result) stay whole. The price: such a default is a wire contract,
changed only as a new field would be.

`data_converter(settings)` adds what the deployment's configuration asks for, in the order the
SDK applies them: payload encryption (gymflow.workers.servers.codec, `GYMFLOW_ENCRYPTION_KEY`), then external
storage of large payloads in S3 (`GYMFLOW_PAYLOAD_STORAGE_URI`), so what S3 holds is encrypted
too. Workers and clients of one deployment must agree on both.

    client = await gymflow.connect()   # TEMPORAL_* / temporal.toml profile / localhost:7233
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import temporalio.api.common.v1
from pydantic import ValidationError
from temporalio.client import Client, Interceptor
from temporalio.contrib.aws.s3driver import S3StorageDriver
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultPayloadConverter,
    ExternalStorage,
    JSONPlainPayloadConverter,
)
from temporalio.exceptions import ApplicationError
from temporalio.runtime import Runtime

from gymflow.activities.errors import INVALID_INPUT
from gymflow.activities.storage import Boto3StorageDriverClient, parse_s3_uri, s3_client
from gymflow.envs.contract import Wire
from gymflow.envs.errors import CodecKeyError
from gymflow.workers.config import Settings
from gymflow.workers.connection import CONNECT_TIMEOUT_S, Connection, ConnectionOptions, dial, resolve
from gymflow.workers.logs import core_runtime
from gymflow.workers.servers.codec import EncryptionCodec


def describe_validation_error(exc: ValidationError) -> str:
    """`field.path: message` for every problem, one line."""
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(root)"
        problems.append(f"{where}: {err['msg']}")
    return f"invalid {exc.title}: " + "; ".join(problems)


class _ValidatingJSONConverter(PydanticJSONPlainPayloadConverter):
    def to_payload(self, value: Any) -> temporalio.api.common.v1.Payload | None:
        if isinstance(value, Wire) and value.compact_json:
            data = value.__pydantic_serializer__.to_json(value, exclude_defaults=True)
            return temporalio.api.common.v1.Payload(metadata={"encoding": self.encoding.encode()}, data=data)
        return super().to_payload(value)

    def from_payload(self, payload: temporalio.api.common.v1.Payload, type_hint: type | None = None) -> Any:
        try:
            return super().from_payload(payload, type_hint)
        except ValidationError as exc:
            raise ApplicationError(describe_validation_error(exc), type=INVALID_INPUT, non_retryable=True) from None


class GymflowPayloadConverter(CompositePayloadConverter):
    """temporalio's pydantic payload converter, with validation errors made workflow failures."""

    def __init__(self) -> None:
        json_converter = _ValidatingJSONConverter()
        super().__init__(
            *(
                json_converter if isinstance(c, JSONPlainPayloadConverter) else c
                for c in DefaultPayloadConverter.default_encoding_payload_converters
            )
        )


DATA_CONVERTER = DataConverter(payload_converter_class=GymflowPayloadConverter)
"""The one data converter of worker, CLI, SDK and tests (plain: no encryption, no external storage)."""


def external_storage(settings: Settings) -> ExternalStorage | None:
    """S3 external storage of large payloads, if `payload_storage_uri` is set.

    Raises:
        gymflow.envs.errors.StorageError: The URI is not s3://bucket[/prefix].
    """
    if not settings.payload_storage_uri:
        return None
    bucket, prefix = parse_s3_uri(settings.payload_storage_uri)
    client = Boto3StorageDriverClient(s3_client(endpoint_url=settings.s3_endpoint_url), prefix=prefix)
    return ExternalStorage(
        drivers=[S3StorageDriver(client=client, bucket=bucket)],
        payload_size_threshold=settings.payload_storage_threshold,
    )


def encryption_codec(settings: Settings) -> EncryptionCodec | None:
    """The payload encryption codec, if `encryption_key` is set.

    Raises:
        gymflow.envs.errors.CodecKeyError: A key is malformed (the message never shows it).
    """
    if settings.encryption_key is None:
        return None
    current = settings.encryption_key.get_secret_value()
    previous = settings.decryption_keys.get_secret_value() if settings.decryption_keys else None
    for variable, keys in (("GYMFLOW_ENCRYPTION_KEY", None), ("GYMFLOW_DECRYPTION_KEYS", previous)):
        try:
            codec = EncryptionCodec.from_specs(current, keys)
        except CodecKeyError as exc:  # say which variable (never the key)
            raise CodecKeyError(f"{variable}: {exc}") from None
    return codec


def data_converter(settings: Settings) -> DataConverter:
    """gymflow's data converter with the encryption and external storage `settings` configure."""
    codec, storage = encryption_codec(settings), external_storage(settings)
    if codec is None and storage is None:
        return DATA_CONVERTER
    return dataclasses.replace(DATA_CONVERTER, payload_codec=codec, external_storage=storage)


async def connect(
    address: str | None = None,
    *,
    namespace: str | None = None,
    profile: str | None = None,
    config_file: str | Path | None = None,
    api_key: str | None = None,
    tls: bool | None = None,
    tls_ca_path: str | Path | None = None,
    tls_cert_path: str | Path | None = None,
    tls_key_path: str | Path | None = None,
    tls_server_name: str | None = None,
    data_converter: DataConverter | None = None,
    connection: Connection | None = None,
    interceptors: Sequence[Interceptor] = (),
    runtime: Runtime | None = None,
    check_search_attributes: bool = True,
    timeout_s: float = CONNECT_TIMEOUT_S,
) -> Client:
    """A Temporal client with gymflow's data converter (or `data_converter(settings)`'s).

    The cluster is found as every gymflow process finds it (gymflow.workers.connection): these
    keywords (the CLI's flags) over `GYMFLOW_TEMPORAL_ADDRESS` / `GYMFLOW_NAMESPACE`, over the
    `TEMPORAL_*` variables and the temporal.toml profile (`profile`, `config_file`), over
    localhost:7233. mTLS and API keys come the same way. A resolved `connection` replaces them all.

        client = await connect()                    # TEMPORAL_ADDRESS / the default profile / localhost
        client = await connect(profile="cloud")     # a temporal.toml profile (mTLS or an API key)

    On a cluster other than a local dev server it checks that gymflow's search attributes exist
    (`check_search_attributes`), so a rollout is never refused later for want of one.

    Its runtime forwards the SDK core's log lines to the `temporalio.core` Python logger
    (gymflow.workers.logs), so they never reach stdout.

    Raises:
        gymflow.workers.connection.ConnectionFailed: The cluster cannot be reached or refused the
            credentials (the message says which and what to fix), within `timeout_s`.
        gymflow.workers.servers.temporal.MissingSearchAttributes: The cluster lacks gymflow's search attributes.
    """
    if connection is None:
        options = ConnectionOptions(
            address=address,
            namespace=namespace,
            profile=profile,
            config_file=Path(config_file) if config_file is not None else None,
            api_key=api_key,
            tls=tls,
            tls_ca_path=Path(tls_ca_path) if tls_ca_path is not None else None,
            tls_cert_path=Path(tls_cert_path) if tls_cert_path is not None else None,
            tls_key_path=Path(tls_key_path) if tls_key_path is not None else None,
            tls_server_name=tls_server_name,
        )
        connection = resolve(
            options,
            gymflow_address=os.environ.get("GYMFLOW_TEMPORAL_ADDRESS") or None,
            gymflow_namespace=os.environ.get("GYMFLOW_NAMESPACE") or None,
        )
    kwargs = connection.connect_kwargs()
    client = await dial(
        connection,
        lambda: Client.connect(
            **kwargs,
            data_converter=data_converter or DATA_CONVERTER,
            runtime=runtime or core_runtime(),
            interceptors=list(interceptors),
        ),
        timeout_s=timeout_s,
    )
    if check_search_attributes and not connection.local_dev:
        from gymflow.workers.servers.temporal import check_search_attributes as check

        await check(client, connection)
    return client
