#!/usr/bin/env bash
# The Python environment the SDK's tests run in (default target/python-test):
# the SDK's dependencies, LangGraph, pytest and the code generator, each at
# its version in constraints.txt. Made again only when constraints.txt
# changed. The tests import the SDK from packaging/python/src; the shipped
# wheel is tested by installing it offline into a fresh environment.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${1:-$root/target/python-test}"
if [[ -x "$venv/bin/python" ]] && cmp -s "$here/constraints.txt" "$venv/.constraints"; then
  exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q -c "$here/constraints.txt" \
  connect-python protobuf googleapis-common-protos pyqwest \
  langgraph langgraph-checkpoint-sqlite openai-agents pydantic-ai-slim pytest \
  grpcio-tools protoc-gen-connect-python setuptools wheel
cp "$here/constraints.txt" "$venv/.constraints"
echo "python test environment: $venv ($("$venv/bin/python" --version))"
