#!/usr/bin/env bash
# Compares the benches of two revisions on this machine: builds both,
# runs their bench binaries alternately (base, head, head, base, ...) so
# that both see the same machine, and prints each row's median figures
# and the ratio head/base of its first figure (the rate).
#
#   benches/compare.sh BASE [HEAD]
#
# BASE and HEAD are git revisions; without HEAD, the working tree as it
# is (uncommitted changes included). Rows are matched by their label.
#
#   AGENTBAY_COMPARE_BENCHES  benches to run (default: store capacity runtime builtin)
#   AGENTBAY_COMPARE_ROUNDS   runs of each side (default 3)
#   AGENTBAY_BENCH_SECONDS    time per row (default 3)
#
# Run it before a change to the store, the grains, capacity or the
# runtime is resolved, and give its table with the change. Noise on a
# 2-core machine is about +-20 %; a factor is not noise.
set -euo pipefail

usage() { echo "usage: benches/compare.sh BASE [HEAD]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage

repo=$(git rev-parse --show-toplevel)
cd "$repo"
base_rev=$(git rev-parse --verify "$1^{commit}")
head_rev=""
[ $# -eq 2 ] && head_rev=$(git rev-parse --verify "$2^{commit}")
benches=${AGENTBAY_COMPARE_BENCHES:-store capacity runtime builtin}
rounds=${AGENTBAY_COMPARE_ROUNDS:-3}
export AGENTBAY_BENCH_SECONDS=${AGENTBAY_BENCH_SECONDS:-3}
# Both sides share one target directory: dependencies build once.
target=${CARGO_TARGET_DIR:-$repo/target}

work=$(mktemp -d "${TMPDIR:-/tmp}/agentbay-compare.XXXXXX")
cleanup() {
  for side in base head; do
    if [ -d "$work/src-$side" ]; then
      git worktree remove --force "$work/src-$side" >/dev/null 2>&1 || true
    fi
  done
  rm -rf "$work"
}
trap cleanup EXIT

# Checks out a revision (or takes the working tree) for one side.
source_of() {
  local side=$1 rev=$2
  if [ -z "$rev" ]; then
    echo "$repo"
  else
    git worktree add --detach --quiet "$work/src-$side" "$rev"
    echo "$work/src-$side"
  fi
}

# Builds the side's bench binaries into $work/bin-<side>/<bench>.
build() {
  local side=$1 src=$2 args=() b
  for b in $benches; do
    if [ -f "$src/benches/$b.rs" ]; then
      args+=(--bench "$b")
    else
      echo "$side has no bench $b: its rows are missing on that side" >&2
    fi
  done
  mkdir -p "$work/bin-$side"
  [ ${#args[@]} -gt 0 ] || return 0
  echo "--- building the $side benches ($src)" >&2
  (cd "$src" && CARGO_TARGET_DIR="$target" cargo bench --no-run --message-format=json "${args[@]}") |
    python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "bench" in m["target"]["kind"]:
        print(m["target"]["name"], m["executable"])
' | while read -r name exe; do
      cp "$exe" "$work/bin-$side/$name"
    done
}

base_src=$(source_of base "$base_rev")
head_src=$(source_of head "$head_rev")
build base "$base_src"
build head "$head_src"

mkdir -p "$work/out"
run() {
  local side=$1 bench=$2 round=$3 src
  [ -x "$work/bin-$side/$bench" ] || return 0
  src=$base_src
  [ "$side" = head ] && src=$head_src
  echo "--- round $round: $side $bench" >&2
  (cd "$src" && "$work/bin-$side/$bench") >"$work/out/$side.$bench.$round" 2>"$work/out/$side.$bench.$round.err" ||
    { echo "$side $bench failed:" >&2; tail -20 "$work/out/$side.$bench.$round.err" >&2; exit 1; }
}
for round in $(seq 1 "$rounds"); do
  for bench in $benches; do
    if [ $((round % 2)) -eq 1 ]; then
      run base "$bench" "$round"; run head "$bench" "$round"
    else
      run head "$bench" "$round"; run base "$bench" "$round"
    fi
  done
done

echo
echo "base $base_rev, head ${head_rev:-working tree}; $rounds runs each, ${AGENTBAY_BENCH_SECONDS} s per row; medians"
python3 - "$work/out" "$benches" <<'EOF'
import os, re, statistics, sys

out, benches = sys.argv[1], sys.argv[2].split()
number = re.compile(r"^(-?[0-9]+(\.[0-9]+)?|-)$")
volatile = re.compile(r"\s*\(\s*[0-9]+\.[0-9]+[^)]*\)")

def rows(path):
    """Label -> figures, for every line that ends in two or more figures
    (a figure is a number, or "-" for none)."""
    found = {}
    for line in open(path):
        tokens = line.split()
        tail = []
        while tokens and number.match(tokens[-1]):
            t = tokens.pop()
            tail.insert(0, float("nan") if t == "-" else float(t))
        if len(tail) >= 2 and tokens:
            # Statistics in a label, such as "(27.8 commits per flush)" in
            # older revisions, vary from run to run: they are not its name.
            label = volatile.sub("", " ".join(tokens))
            found[label] = tail
    return found

def medians(side, bench):
    runs = [rows(os.path.join(out, f)) for f in sorted(os.listdir(out))
            if f.startswith(f"{side}.{bench}.") and not f.endswith(".err")]
    labels = []
    for r in runs:
        labels += [l for l in r if l not in labels]
    return {l: [statistics.median(v) for v in zip(*[r[l] for r in runs if l in r])]
            for l in labels}

fmt = lambda figures: " ".join(f"{x:.6g}" for x in figures) if figures else "-"
print(f"{'row':<64} {'base':>10} {'head':>10} {'head/base':>9}  figures base | head")
for bench in benches:
    base, head = medians("base", bench), medians("head", bench)
    labels = list(head) + [l for l in base if l not in head]
    if not labels:
        continue
    print(f"[{bench}]")
    for label in labels:
        b, h = base.get(label), head.get(label)
        ratio = f"{h[0] / b[0]:.2f}x" if b and h and b[0] else "-"
        rate = lambda figures: f"{figures[0]:.0f}" if figures else "-"
        print(f"{label[:64]:<64} {rate(b):>10} {rate(h):>10} {ratio:>9}  {fmt(b)} | {fmt(h)}")
EOF
