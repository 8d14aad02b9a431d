#!/usr/bin/env bash
# Builds the SDK's wheel and gathers the wheels of its dependencies for an
# offline install: `pip install --no-index --find-links DIR agentbay`.
#
#   build-wheels.sh DIR [linux-x86_64|linux-aarch64|windows-x86_64]
#
# The dependencies are binary wheels for CPython 3.11 and later on the
# target (pyqwest and protobuf ship abi3 wheels: one serves every CPython
# from 3.11 on), at the versions of constraints.txt; the extras' for
# CPython 3.11 to 3.14. Needs the package
# index once, where the packages are built; never where they are installed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$(mkdir -p "${1:?usage: build-wheels.sh DIR [target]}" && cd "$1" && pwd)"
target="${2:-linux-$(uname -m)}"
case "$target" in
  linux-x86_64) platforms=(manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64) ;;
  linux-aarch64) platforms=(manylinux_2_28_aarch64 manylinux_2_17_aarch64 manylinux2014_aarch64) ;;
  windows-x86_64) platforms=(win_amd64) ;;
  *) echo "unknown target $target" >&2; exit 2 ;;
esac

venv="${PY_BUILD_VENV:-$root/target/python-build}"
if [[ ! -x "$venv/bin/pip" ]]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q -U -c "$here/constraints.txt" setuptools wheel
rm -f "$out"/agentbay-*.whl
"$venv/bin/pip" wheel -q --no-deps --no-build-isolation -w "$out" "$here"
# The SDK's own dependencies, exactly as pinned, for the target.
deps=$(sed -n '/^dependencies = \[/,/^\]/p' "$here/pyproject.toml" | grep -o '"[^"]*"' | tr -d '"')
# The extras' (LangGraph, the OpenAI Agents SDK, Pydantic AI), as pinned:
# `pip install --no-index --find-links DIR 'agentbay[openai-agents]'`.
extras=$(sed -n '/^\[project.optional-dependencies\]/,/^\[/p' "$here/pyproject.toml" | grep -o '"[^"]*"' | tr -d '"')
platform_args=()
for p in "${platforms[@]}"; do platform_args+=(--platform "$p"); done
"$venv/bin/pip" download -q -d "$out" -c "$here/constraints.txt" \
  --only-binary=:all: --python-version 3.11 --implementation cp "${platform_args[@]}" $deps
# Some of the extras' dependencies are built for one CPython each (not
# abi3): the wheels of every CPython the packages support.
for version in 3.11 3.12 3.13 3.14; do
  "$venv/bin/pip" download -q -d "$out" -c "$here/constraints.txt" \
    --only-binary=:all: --python-version "$version" --implementation cp "${platform_args[@]}" $extras
done
ls "$out"
