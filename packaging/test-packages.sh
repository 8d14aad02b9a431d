#!/usr/bin/env bash
# Checks the artefacts of packaging/build.sh on this machine (as root, or
# with sudo): installs the .deb, runs the installed binary, serves and
# answers over TLS, upgrades over itself keeping data and configuration,
# upgrades a store of the previous schema (backed up first), removes (data
# kept) and purges (data gone); checks the MSI's tables when an MSI was
# built, and installs it under Wine (packaging/test-msi.sh) where wine is
# installed. Prints the sizes and the install-to-healthy time.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
DEB=$(ls target/packages/agentbay_*_amd64.deb | head -1)
PORT=18543
TMP=$(mktemp -d)
trap 'kill $(cat "$TMP"/pid* 2>/dev/null) 2>/dev/null || true; rm -rf "$TMP"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

wait_healthy() { # url ca
    for _ in $(seq 1 200); do
        if curl -fsS --cacert "$2" "$1/healthz" >/dev/null 2>&1; then return 0; fi
        sleep 0.05
    done
    fail "$1 did not become healthy"
}

token() { # url ca id secret
    curl -fsS --cacert "$2" -u "$3:$4" -d grant_type=client_credentials "$1/oauth/token" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["access_token"])'
}

echo "--- install $DEB ($(du -h "$DEB" | cut -f1))"
command -v adduser >/dev/null || $SUDO apt-get install -y -qq adduser
START=$(date +%s.%N)
$SUDO dpkg -i "$DEB"
agentbay version
$SUDO test -f /etc/agentbay/bootstrap-credential.json || fail "no bootstrap credential file"
[ "$($SUDO stat -c '%U %a' /etc/agentbay/bootstrap-credential.json)" = "root 600" ] || fail "the credential file is not root-only"
$SUDO test -d /var/lib/agentbay/store || fail "no store in /var/lib/agentbay"

echo "--- the Python SDK installs from the package with no network"
ls /usr/share/agentbay/python/agentbay-*.whl >/dev/null || fail "no SDK wheel in /usr/share/agentbay/python"
python3 -m venv "$TMP/sdk"
PIP_CONFIG_FILE=/dev/null "$TMP/sdk/bin/pip" install -q --no-index \
    --find-links /usr/share/agentbay/python agentbay || fail "the SDK does not install offline"
PIP_CONFIG_FILE=/dev/null "$TMP/sdk/bin/pip" install -q --no-index \
    --find-links /usr/share/agentbay/python 'agentbay[langgraph,openai-agents,pydantic-ai]' ||
    fail "the SDK's framework extras do not install offline"
"$TMP/sdk/bin/python" -c 'import agentbay.langgraph, agentbay.openai_agents, agentbay.pydantic_ai' ||
    fail "the SDK's framework integrations do not import"

echo "--- the examples are installed where README says, whole"
for f in $(cd packaging/examples && find . -type f | sed 's#^\./##'); do
    cmp -s "packaging/examples/$f" "/usr/share/doc/agentbay/examples/$f" ||
        fail "/usr/share/doc/agentbay/examples/$f is missing or differs from packaging/examples/$f"
done
# A release made from an installed example verifies (README, "Releases").
EX=$(mktemp -d)
cp -r /usr/share/doc/agentbay/examples/releases/triage "$EX/my-agent"
(cd "$EX" && agentbay release keygen --out ci >/dev/null &&
    agentbay release sign ./my-agent --key ci.key --update-hashes >/dev/null &&
    agentbay release verify ./my-agent --trust ci.pub >/dev/null) ||
    fail "a release made from the installed triage example does not verify"
rm -rf "$EX"

echo "--- the alert rules, their unit tests and the dashboard are installed, and promtool accepts them"
# The package's file list is read whole before grep looks at it (pipefail
# and an early-exiting grep -q, as for the MSI's tables below).
INSTALLED=$(dpkg -L agentbay)
for f in /usr/share/agentbay/prometheus/agentbay-rules.yml /usr/share/agentbay/prometheus/agentbay-rules.test.yml \
    /usr/share/agentbay/grafana/agentbay-dashboard.json; do
    grep -qx "$f" <<<"$INSTALLED" || fail "the package does not hold $f"
    [ -f "$f" ] || fail "$f is not installed"
done
python3 -m json.tool /usr/share/agentbay/grafana/agentbay-dashboard.json >/dev/null ||
    fail "the installed Grafana dashboard is not JSON"
if command -v promtool >/dev/null; then
    promtool check rules /usr/share/agentbay/prometheus/agentbay-rules.yml ||
        fail "promtool check rules refuses the installed alert rules"
    promtool test rules /usr/share/agentbay/prometheus/agentbay-rules.test.yml ||
        fail "the installed alert rules fail their unit tests"
else
    echo "promtool: not installed here, the installed rules are not checked (Debian: apt-get install prometheus)"
fi

if command -v systemd-analyze >/dev/null; then
    systemd-analyze verify /lib/systemd/system/agentbay.service
    systemd-analyze security --offline=true /lib/systemd/system/agentbay.service | tail -1
fi

# What systemd's Delegate= gives the packaged unit, where this machine has
# the v1 controllers and no systemd: a group under each controller's
# hierarchy that the service account owns, with the service in it.
DELEGATED=()
if [ -d /sys/fs/cgroup/memory ] && [ -d /sys/fs/cgroup/pids ]; then
    for c in cpu cpuacct memory pids; do
        [ -d "/sys/fs/cgroup/$c" ] || continue
        own=$(awk -F: -v c="$c" '{n=split($2,a,","); for(i=1;i<=n;i++) if(a[i]==c) print $3}' /proc/self/cgroup)
        d="/sys/fs/cgroup/$c${own%/}/agentbay-package-test-$$"
        $SUDO mkdir -p "$d"
        for f in "$d" "$d/cgroup.procs" "$d/tasks"; do $SUDO chown agentbay:agentbay "$f"; done
        DELEGATED+=("$d")
    done
elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    # cgroup v2: one group with cpu, memory and pids for its children,
    # beside this script's own when that holds processes (a group with
    # processes gives its children no controllers).
    own=$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup)
    base="/sys/fs/cgroup${own%/}"
    if ! echo "+cpu +memory +pids" | $SUDO tee "$base/cgroup.subtree_control" >/dev/null 2>&1; then
        base=$(dirname "$base")
    fi
    d="$base/agentbay-package-test-$$"
    $SUDO mkdir -p "$d"
    for f in "$d" "$d/cgroup.procs" "$d/cgroup.subtree_control"; do $SUDO chown agentbay:agentbay "$f"; done
    DELEGATED+=("$d")
fi

echo "--- the installed appliance (packaged config, data in /var/lib/agentbay, delegated cgroups: ${#DELEGATED[@]})"
URL="https://127.0.0.1:$PORT"
$SUDO sh -c 'for d in "$@"; do echo $$ > "$d/cgroup.procs"; done
    exec runuser -u agentbay -- agentbay serve --config /etc/agentbay/agentbay.toml --listen "127.0.0.1:'"$PORT"'"' \
    sh "${DELEGATED[@]}" > "$TMP/serve.log" 2>&1 &
echo $! > "$TMP/pid1"
$SUDO cp /var/lib/agentbay/tls/ca.pem "$TMP/ca.pem"
wait_healthy "$URL" "$TMP/ca.pem"
HEALTHY=$(date +%s.%N)
ID=$($SUDO python3 -c 'import json; print(json.load(open("/etc/agentbay/bootstrap-credential.json"))["client_id"])')
SECRET=$($SUDO python3 -c 'import json; print(json.load(open("/etc/agentbay/bootstrap-credential.json"))["client_secret"])')
TOKEN=$(token "$URL" "$TMP/ca.pem" "$ID" "$SECRET")
[ -n "$TOKEN" ] || fail "no token"
# The SDK installed from the package talks to the installed appliance.
AGENTBAY_URL="$URL" AGENTBAY_CA="$TMP/ca.pem" AGENTBAY_TOKEN="$TOKEN" "$TMP/sdk/bin/python" -c '
import agentbay
from agentbay.admin.v1 import admin_pb2
c = agentbay.Client.from_env()
print("sdk: appliance", c.admin.get_version(admin_pb2.GetVersionRequest()).version)
' || fail "the packaged SDK cannot call the installed appliance"
# The console's admin signs in with the password from the same file.
PASSWORD=$($SUDO python3 -c 'import json; print(json.load(open("/etc/agentbay/bootstrap-credential.json"))["console_password"])')
SIGNIN=$(curl -sS --cacert "$TMP/ca.pem" -o /dev/null -w '%{http_code} %header{set-cookie}' \
    --data-urlencode username=admin --data-urlencode "password=$PASSWORD" "$URL/signin")
case "$SIGNIN" in
    "303 __Host-agentbay_session="*HttpOnly*) ;;
    *) fail "the console's admin cannot sign in: $SIGNIN" ;;
esac
curl -fsS --cacert "$TMP/ca.pem" -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
    -d '{"tenantId":"site","edition":"team"}' "$URL/agentbay.admin.v1.Admin/PutTenant" >/dev/null
# A release's MCP stdio tool runs under the packaged account and
# configuration, and its receipt says what bound it.
mkdir -p "$TMP/tool-run"
EXPECT_CGROUP=${#DELEGATED[@]} python3 packaging/test-tool-run.py "$URL" "$TMP/ca.pem" "$TOKEN" "$TMP/tool-run" ||
    { tail -50 "$TMP/serve.log"; fail "a release's MCP tool did not run under the packaged account"; }
# The packaged configuration takes a backup at start and every 15 minutes
# into /var/lib/agentbay-backups: one appears, private to the service's
# account, verifies as `agentbay backup verify` checks it, and /readyz and
# the metrics say so.
BACKUP=""
for _ in $(seq 1 60); do
    BACKUP=$($SUDO sh -c 'ls /var/lib/agentbay-backups/agentbay-*.backup 2>/dev/null | head -1' || true)
    [ -n "$BACKUP" ] && break
    sleep 0.5
done
[ -n "$BACKUP" ] || { tail -50 "$TMP/serve.log"; fail "no scheduled backup appeared in /var/lib/agentbay-backups"; }
[ "$($SUDO stat -c '%U %a' "$BACKUP")" = "agentbay 600" ] ||
    fail "the backup $BACKUP is not private to the agentbay account: $($SUDO stat -c '%U %a' "$BACKUP")"
$SUDO runuser -u agentbay -- agentbay backup verify "$BACKUP" || fail "the scheduled backup $BACKUP does not verify"
READY=""
for _ in $(seq 1 60); do
    READY=$(curl -sS --cacert "$TMP/ca.pem" "$URL/readyz")
    python3 -c 'import json,sys; b=json.loads(sys.argv[1]).get("backup") or {}; sys.exit(0 if (b.get("last") or {}).get("verified") else 1)' "$READY" && break
    sleep 0.5
done
python3 -c 'import json,sys; b=json.loads(sys.argv[1]).get("backup") or {}; sys.exit(0 if (b.get("last") or {}).get("verified") else 1)' "$READY" ||
    fail "/readyz does not show the verified scheduled backup: $READY"
METRICS=$(curl -fsS --cacert "$TMP/ca.pem" -H "Authorization: Bearer $TOKEN" "$URL/metrics")
grep -qx 'agentbay_backup_last_result 1' <<<"$METRICS" || fail "the metrics do not show the good backup"
grep -qx 'agentbay_backup_enabled 1' <<<"$METRICS" || fail "the metrics do not show scheduled backups on"
$SUDO kill -TERM "$(cat "$TMP/pid1")"; wait "$(cat "$TMP/pid1")" 2>/dev/null || true
for d in "${DELEGATED[@]}"; do $SUDO rmdir "$d" 2>/dev/null || true; done
echo "install-to-healthy: $(python3 -c "print(round($HEALTHY - $START, 2))") s"

echo "--- init and serve with the packaged config from a temp location"
cp /etc/agentbay/agentbay.toml "$TMP/agentbay.toml" 2>/dev/null || $SUDO cat /etc/agentbay/agentbay.toml > "$TMP/agentbay.toml"
sed -i "s#^data_dir = .*#data_dir = \"$TMP/data\"#; s#^listen = .*#listen = \"127.0.0.1:$((PORT + 1))\"#; s#^dir = .*#dir = \"$TMP/backups\"#" "$TMP/agentbay.toml"
agentbay init --config "$TMP/agentbay.toml" --json > "$TMP/cred.json"
agentbay serve --config "$TMP/agentbay.toml" > "$TMP/serve2.log" 2>&1 &
echo $! > "$TMP/pid2"
wait_healthy "https://127.0.0.1:$((PORT + 1))" "$TMP/data/tls/ca.pem"
ID2=$(python3 -c "import json; print(json.load(open('$TMP/cred.json'))['client_id'])")
SECRET2=$(python3 -c "import json; print(json.load(open('$TMP/cred.json'))['client_secret'])")
token "https://127.0.0.1:$((PORT + 1))" "$TMP/data/tls/ca.pem" "$ID2" "$SECRET2" >/dev/null
kill -TERM "$(cat "$TMP/pid2")"; wait "$(cat "$TMP/pid2")" 2>/dev/null || true

echo "--- upgrade over itself: data and configuration kept"
echo "# edited on site" | $SUDO tee -a /etc/agentbay/agentbay.toml >/dev/null
$SUDO dpkg -i --force-confold "$DEB"
$SUDO grep -q "edited on site" /etc/agentbay/agentbay.toml || fail "the upgrade replaced the edited configuration"
$SUDO runuser -u agentbay -- agentbay serve --config /etc/agentbay/agentbay.toml --listen "127.0.0.1:$PORT" \
    > "$TMP/serve3.log" 2>&1 &
echo $! > "$TMP/pid3"
wait_healthy "$URL" "$TMP/ca.pem"
TOKEN=$(token "$URL" "$TMP/ca.pem" "$ID" "$SECRET")
TENANTS=$(curl -fsS --cacert "$TMP/ca.pem" -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
    -d '{}' "$URL/agentbay.admin.v1.Admin/ListTenants")
grep -q '"site"' <<<"$TENANTS" || fail "the upgrade lost the data"
$SUDO kill -TERM "$(cat "$TMP/pid3")"; wait "$(cat "$TMP/pid3")" 2>/dev/null || true

echo "--- upgrade from an earlier version's store: backed up as found, then migrated and served"
# The previous release's data directory stands in as the fixture store of
# the schema before this one (tests/fixtures/stores), as that version
# wrote it; the package's upgrade keeps it, and the first start of the new
# binary backs it up into backup.dir before migrating it.
CURRENT_SCHEMA=$(agentbay version | sed -n 's/.*(store schema \([0-9]*\)).*/\1/p')
[ -n "$CURRENT_SCHEMA" ] || fail "agentbay version does not name the store schema: $(agentbay version)"
grep -q "(store schema $CURRENT_SCHEMA)" <<<"$(agentbay --version)" || fail "agentbay --version does not name the store schema"
PREVIOUS=$((CURRENT_SCHEMA - 1))
FIXTURE="tests/fixtures/stores/schema-$PREVIOUS.tar.gz"
[ -f "$FIXTURE" ] || fail "no fixture store $FIXTURE"
mkdir -p "$TMP/previous"
tar -xzf "$FIXTURE" -C "$TMP/previous"
$SUDO rm -rf /var/lib/agentbay /var/lib/agentbay-backups/before-upgrade-*
$SUDO cp -a "$TMP/previous/data" /var/lib/agentbay
$SUDO chown -R agentbay:agentbay /var/lib/agentbay
$SUDO chmod 0750 /var/lib/agentbay
$SUDO dpkg -i --force-confold "$DEB"
$SUDO runuser -u agentbay -- agentbay serve --config /etc/agentbay/agentbay.toml --listen "127.0.0.1:$PORT" \
    > "$TMP/serve4.log" 2>&1 &
echo $! > "$TMP/pid4"
$SUDO cp /var/lib/agentbay/tls/ca.pem "$TMP/ca-previous.pem"
wait_healthy "$URL" "$TMP/ca-previous.pem"
READY=$(curl -sS --cacert "$TMP/ca-previous.pem" "$URL/readyz")
python3 -c 'import json,sys; r=json.loads(sys.argv[1]); sys.exit(0 if r["schemaVersion"] == int(sys.argv[2]) else 1)' "$READY" "$CURRENT_SCHEMA" ||
    fail "/readyz does not name schema $CURRENT_SCHEMA after the upgrade: $READY"
PID=$(python3 -c "import json; print(json.load(open('$TMP/previous/credential.json'))['client_id'])")
PSECRET=$(python3 -c "import json; print(json.load(open('$TMP/previous/credential.json'))['client_secret'])")
PTOKEN=$(token "$URL" "$TMP/ca-previous.pem" "$PID" "$PSECRET")
RUNS=$(curl -fsS --cacert "$TMP/ca-previous.pem" -H "Authorization: Bearer $PTOKEN" -H 'Content-Type: application/json' \
    -d '{"tenantId":"demo"}' "$URL/agentbay.runs.v1.Runs/ListRuns")
python3 -c 'import json,sys; sys.exit(0 if len(json.loads(sys.argv[1])["runs"]) >= 4 else 1)' "$RUNS" ||
    fail "the earlier version's runs are not served: $RUNS"
$SUDO kill -TERM "$(cat "$TMP/pid4")"; wait "$(cat "$TMP/pid4")" 2>/dev/null || true
SAFETY=$($SUDO sh -c "ls /var/lib/agentbay-backups/before-upgrade-from-*schema-$PREVIOUS-*.backup 2>/dev/null | head -1" || true)
[ -n "$SAFETY" ] || { tail -30 "$TMP/serve4.log"; fail "no backup before the upgrade in /var/lib/agentbay-backups"; }
[ "$($SUDO stat -c '%U %a' "$SAFETY")" = "agentbay 600" ] ||
    fail "the backup before the upgrade is not private to the agentbay account: $($SUDO stat -c '%U %a' "$SAFETY")"
VERIFIED=$($SUDO runuser -u agentbay -- agentbay backup verify "$SAFETY") || VERIFIED=""
grep -q "(schema version $PREVIOUS)" <<<"$VERIFIED" ||
    fail "the backup before the upgrade does not verify as schema $PREVIOUS"
$SUDO runuser -u agentbay -- agentbay check --config /etc/agentbay/agentbay.toml > "$TMP/check.txt" ||
    { cat "$TMP/check.txt"; fail "agentbay check finds problems in the upgraded store"; }
echo "upgraded schema $PREVIOUS -> $CURRENT_SCHEMA: $(head -1 "$TMP/check.txt"); backup $SAFETY"

echo "--- remove keeps the data, purge deletes it"
$SUDO dpkg -r agentbay
[ ! -e /usr/bin/agentbay ] || fail "the binary is still installed"
[ ! -e /usr/share/agentbay/prometheus/agentbay-rules.yml ] || fail "the alert rules are still installed"
$SUDO test -d /var/lib/agentbay/store || fail "remove deleted the data"
$SUDO dpkg -P agentbay
! $SUDO test -e /var/lib/agentbay || fail "purge left /var/lib/agentbay"
! getent passwd agentbay >/dev/null || fail "purge left the agentbay user"

MSI=$(ls target/packages/agentbay-*-x64.msi 2>/dev/null | head -1 || true)
if [ -n "$MSI" ]; then
    echo "--- $MSI ($(du -h "$MSI" | cut -f1))"
    # The tables are read whole before grep looks at them: with pipefail, a
    # grep -q that stops reading early would fail msiinfo with SIGPIPE.
    table() { msiinfo export "$MSI" "$1"; }
    TABLES=$(msiinfo tables "$MSI")
    grep -qx ServiceInstall <<<"$TABLES" || fail "the MSI has no ServiceInstall table"
    SERVICE=$(table ServiceInstall); CONTROL=$(table ServiceControl); FILES=$(table File)
    SHORTCUTS=$(table Shortcut); DIRS=$(table Directory)
    UPGRADE=$(table Upgrade); COMPONENTS=$(table Component)
    grep -q "serve --windows-service" <<<"$SERVICE" || fail "the service is not registered"
    grep -q agentbay <<<"$CONTROL" || fail "no service control"
    grep -q "agentbay.exe" <<<"$FILES" || fail "agentbay.exe is not in the MSI"
    grep -q "agentbay-.*-py3-none-any.whl" <<<"$FILES" || fail "the Python SDK's wheel is not in the MSI"
    grep -q "pyqwest-.*win_amd64.whl" <<<"$FILES" || fail "the SDK's dependencies are not in the MSI"
    grep -q "agentbay-rules.yml" <<<"$FILES" || fail "the alert rules are not in the MSI"
    grep -q "agentbay-rules.test.yml" <<<"$FILES" || fail "the alert rules' unit tests are not in the MSI"
    grep -q "agentbay-dashboard.json" <<<"$FILES" || fail "the Grafana dashboard is not in the MSI"
    grep -q "triage_adapter.py" <<<"$FILES" || fail "the examples are not in the MSI"
    grep -q "manifest.json" <<<"$FILES" || fail "the example releases are not in the MSI"
    grep -q "EXAMPLESDIR" <<<"$DIRS" || fail "no examples directory in the MSI"
    grep -q "PROMETHEUSDIR" <<<"$DIRS" || fail "no prometheus directory in the MSI"
    grep -q "README" <<<"$SHORTCUTS" || fail "no shortcut"
    grep -q CommonAppDataFolder <<<"$DIRS" || fail "no ProgramData directory"
    grep -q $'\t513\t\tWIX_UPGRADE_DETECTED' <<<"$UPGRADE" || fail "an install over the same version is not an upgrade"
    grep -q $'^Configuration\t{[0-9A-F-]*}\tINSTALLDIR\t400\t' <<<"$COMPONENTS" ||
        fail "the configuration's component is not Permanent and NeverOverwrite"
    # Installed, served, upgraded and uninstalled under Wine where it is
    # installed (CI installs it).
    if command -v wine >/dev/null && command -v x86_64-w64-mingw32-gcc >/dev/null; then
        packaging/test-msi.sh "$MSI"
    else
        echo "msi: not installed under Wine (wine or mingw-w64 is not installed here)"
    fi
else
    echo "msi: none built (the Windows target is not installed here)"
fi
echo "packages: ok"
