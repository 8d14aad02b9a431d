#!/usr/bin/env bash
# Generates the SDK's wire layer from static/proto: protobuf messages
# (protoc's python and pyi output) and Connect clients
# (protoc-gen-connect-python), into src/agentbay/<service>/v1/. The output
# is committed; `generate.sh --check` regenerates into a temporary
# directory and fails when the committed files differ (CI runs it).
#
# A second language is the same recipe: one protoc run with that
# language's Connect plugin over the same files.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
check=0
[[ "${1:-}" == "--check" ]] && check=1

venv="${PY_GEN_VENV:-$root/target/python-gen}"
if [[ ! -x "$venv/bin/protoc-gen-connect-python" ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -c "$here/constraints.txt" grpcio-tools protoc-gen-connect-python
fi

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
protos=$(cd "$root/static/proto" && find agentbay -name '*.proto' | sort)
(cd "$root/static/proto" &&
  PATH="$venv/bin:$PATH" "$venv/bin/python" -m grpc_tools.protoc -I . \
    --python_out="$out" --pyi_out="$out" --connect-python_out="$out" $protos)
# Every generated directory is a package of the SDK.
find "$out/agentbay" -type d -exec sh -c 'for d; do : > "$d/__init__.py"; done' sh {} +
rm -f "$out/agentbay/__init__.py"

dest="$here/src/agentbay"
if [[ $check == 1 ]]; then
  status=0
  for d in $(cd "$out/agentbay" && ls); do
    diff -r "$out/agentbay/$d" "$dest/$d" >/dev/null || {
      echo "src/agentbay/$d differs from what static/proto generates: run packaging/python/generate.sh" >&2
      status=1
    }
  done
  exit $status
fi
for d in $(cd "$out/agentbay" && ls); do
  rm -rf "${dest:?}/$d"
  cp -r "$out/agentbay/$d" "$dest/$d"
done
echo "generated: $(cd "$out/agentbay" && find . -name '*.py' | wc -l) modules under src/agentbay"
