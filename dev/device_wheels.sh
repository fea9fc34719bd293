#!/usr/bin/env bash
# The wheels the GPU machine (device tool: Python 3.12, torch, Triton, transformers, uvloop; no registry)
# lacks for rlt's GPU tests and benchmarks, downloaded here into .whl/ (git-ignored; carry it). The
# machine installs them (dev/device_env.sh: `pip install --no-index --no-deps --target /tmp/site .whl/*.whl`).
# NIXL (nixl-cu13, 56 MiB of the 64 MiB a call carries) only for PD runs: WITH_NIXL=1.
set -euo pipefail
cd "$(dirname "$0")/.."
get() {
  env -u PIP_FIND_LINKS -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null pip download -q --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "$@"
}
get 'pyzmq>=27,<28' 'msgspec>=0.19,<0.24' 'pytest-asyncio>=1.0,<2' xgrammar==0.2.9 'apache-tvm-ffi>=0.1.11'
get pydantic==2.13.4 pydantic-core==2.46.4 annotated-types typing-inspection  # (xgrammar's structural tags)
get jsonschema jsonschema-specifications referencing rpds-py attrs  # (the grammar tests' validation)
if [ "${WITH_NIXL:-0}" = 1 ]; then get nixl==1.5.1 nixl-cu13==1.5.1; fi
du -sh .whl
