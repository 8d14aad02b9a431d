#!/usr/bin/env bash
# Installs the MSI of packaging/build.sh under Wine (Debian's wine64) as a
# Windows site would, and checks it: the service the MSI defines is
# registered and started, /healthz and /readyz answer over HTTPS with the
# generated CA, the Job Object probe of tool processes ran, the service
# logs to ProgramData\agentbay\logs, the demo runs to its expected states,
# the service stops, an install over itself keeps the data and the edited
# configuration, a store of the previous schema is backed up before it is
# migrated, and uninstalling removes the program and the service but keeps
# the data directory and the configuration.
#
# What Wine (Debian 12's 8.0) does not do as Windows does is said where it
# matters (README, "Packages: .deb and MSI"): it runs the service as the
# Linux account running the test (there is no LocalSystem account); it has
# no bcryptprimitives.dll, whose ProcessPrng Rust's standard library calls
# for random bytes, so the test builds a stand-in from
# packaging/windows/wine-bcryptprimitives.c into its prefix (Windows 10
# and later have it; the MSI installs nothing of the kind); its Job
# Objects refuse a tool's limits, so tools are refused there, as /readyz
# says; kill-on-close, which the appliance's probe checks at start, works.
# Wine ends a prefix's services once no ordinary process is left in it: a
# placeholder process keeps the prefix alive, as a logged-in session does.
# Its first boot can leave two service control managers running, which
# loses the service msiexec creates; the test restarts the prefix first.
#
#   packaging/test-msi.sh [MSI]
set -euo pipefail
cd "$(dirname "$0")/.."
# Wine hands the Unix environment to Windows programs: the appliance's
# configuration comes from the MSI's agentbay.toml alone.
while read -r name; do unset "$name"; done < <(env | sed -n 's/^\(AGENTBAY_[A-Z0-9_]*\)=.*/\1/p')
MSI=${1:-$(ls target/packages/agentbay-*-x64.msi | head -1)}
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
TMP=$(mktemp -d)
export WINEPREFIX="$TMP/wine" WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml="
trap 'kill "${KEEPER:-0}" 2>/dev/null; wineserver -k 2>/dev/null || true; rm -rf "$TMP"' EXIT
START=$(date +%s)

C="$WINEPREFIX/drive_c"
LOGS="$C/ProgramData/agentbay/logs"
fail() {
    echo "FAIL: $*" >&2
    # The service's own log (log.dir in the MSI's configuration).
    tail -n 30 "$LOGS"/agentbay.*.log 1>&2 2>/dev/null || true
    exit 1
}
PROGRAM="$C/Program Files/agentbay"
DATA="$C/ProgramData/agentbay/data"
BACKUPS="$C/ProgramData/agentbay/backups"
URL=https://127.0.0.1:8443
EXE='C:\Program Files\agentbay\agentbay.exe'
WINDATA='C:\ProgramData\agentbay\data'

wait_healthy() {
    for _ in $(seq 1 600); do
        if [ -f "$DATA/tls/ca.pem" ] && curl -fsS --cacert "$DATA/tls/ca.pem" "$URL/healthz" >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.1
    done
    fail "the service did not become healthy at $URL"
}
service_state() { wine sc query agentbay 2>/dev/null | tr -d '\r' | sed -n 's/.*STATE *: *[0-9]* *\([A-Z_]*\).*/\1/p'; }
rpc() { # method body
    curl -fsS --cacert "$DATA/tls/ca.pem" -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
        -d "$2" "$URL/$1"
}

echo "--- a Windows prefix"
wineboot -i >/dev/null 2>&1
# Wine 8 can leave the prefix with two services.exe after its first boot,
# each with its own service table, so a service one creates is unknown to
# the other: the prefix is shut down and started again with one.
wineserver -w
x86_64-w64-mingw32-gcc -O2 -shared -Wl,--kill-at -o "$C/windows/system32/bcryptprimitives.dll" \
    packaging/windows/wine-bcryptprimitives.c -ladvapi32
wine ping -n 100000 127.0.0.1 >/dev/null 2>&1 &
KEEPER=$!
if curl -s -o /dev/null "https://127.0.0.1:8443" 2>/dev/null; then fail "port 8443 is taken"; fi

echo "--- msiexec /i $MSI"
wine msiexec /i "$(winepath -w "$MSI")" /qn /l*v "$(winepath -w "$TMP/install.log")" ||
    { cat "$TMP/install.log" | tail -40; fail "msiexec /i failed"; }
[ -f "$PROGRAM/agentbay.exe" ] || fail "agentbay.exe is not in Program Files\\agentbay"
[ -f "$PROGRAM/agentbay.toml" ] || fail "agentbay.toml is not in Program Files\\agentbay"
wine reg query 'HKLM\System\CurrentControlSet\Services\agentbay' /v ImagePath 2>/dev/null | tr -d '\r' |
    grep -q 'serve --windows-service' || fail "the service agentbay is not registered as the MSI defines it"
wait_healthy
HEALTHY=$(date +%s)
[ "$(service_state)" = RUNNING ] || fail "the service is not RUNNING: $(wine sc query agentbay)"
echo "install-to-healthy: $((HEALTHY - START)) s (with the Wine prefix)"

echo "--- /healthz and /readyz over HTTPS with the generated CA"
grep -q '"ok"' <<<"$(curl -fsS --cacert "$DATA/tls/ca.pem" "$URL/healthz")" || fail "/healthz"
READY=""
for _ in $(seq 1 100); do
    READY=$(curl -sS --cacert "$DATA/tls/ca.pem" "$URL/readyz")
    python3 -c 'import json,sys; r=json.loads(sys.argv[1]); b=r.get("backup") or {}; sys.exit(0 if r["ready"] and "probed" not in r["tools"]["killOnClose"] and (b.get("last") or b.get("error")) else 1)' "$READY" && break
    sleep 0.2
done
python3 - "$READY" <<'PY' || fail "/readyz: $READY"
import json, sys
r = json.loads(sys.argv[1])
assert r["ready"] is True, "not ready"
assert r["schemaVersion"] >= 1, "no schema version"
tools = r["tools"]
# A process joins a Job Object and ends when the job closes. Windows takes
# a tool's limits (mechanism job-object); Wine refuses them (refused, and
# the limit it refused is named).
assert tools["mechanism"] in ("job-object", "refused"), tools
assert tools["mechanism"] == "job-object" or "refused its" in tools["limits"], tools
assert tools["killOnClose"].startswith("verified"), tools
print("tools:", tools["mechanism"], "/", tools["limits"], "/", tools["killOnClose"])
# The packaged configuration's backup at start, in ProgramData\agentbay\backups,
# written, synced and verified.
backup = r["backup"]
assert backup.get("error") is None, backup
assert backup["last"]["verified"] is True, backup
print("backup:", backup["last"]["file"])
PY

# The service logs to ProgramData\agentbay\logs: its standard error goes
# nowhere.
LOG=$(ls "$LOGS"/agentbay.*.log 2>/dev/null | head -1)
[ -n "$LOG" ] || fail "the service wrote no log in ProgramData\\agentbay\\logs"
grep -q '"scheduled backup taken and verified"' "$LOG" || fail "the service's log: $(cat "$LOG")"

echo "--- the demo runs to its expected states"
# A PlatformAdmin client, made through the running service as an
# Administrator would (the service's first start had no console to print
# the bootstrap credentials on).
CRED=$(wine "$EXE" client create --data-dir "$WINDATA" --tenant platform --scope agentbay.platform --scope factory.runs.read --json 2>"$TMP/client.err" | tr -d '\r') ||
    fail "client create: $(cat "$TMP/client.err")"
ID=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["client_id"])' "$CRED") || fail "client create: $CRED"
SECRET=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["client_secret"])' "$CRED")
token() { curl -fsS --cacert "$DATA/tls/ca.pem" -u "$ID:$SECRET" -d grant_type=client_credentials "$URL/oauth/token" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["access_token"])'; }
# The packaged configuration turns the demo off; turned on (with its key
# trusted), the next start seeds it.
wine net stop agentbay >/dev/null 2>&1 || fail "net stop agentbay"
[ "$(service_state)" = STOPPED ] || fail "the service did not stop: $(service_state)"
sed -i -e 's/^enabled = false/enabled = true/' -e 's/^trust_demo_key = false/trust_demo_key = true/' "$PROGRAM/agentbay.toml"
wine net start agentbay >/dev/null 2>&1 || fail "net start agentbay"
wait_healthy
TOKEN=$(token)
DEMO=""
for _ in $(seq 1 300); do
    DEMO=$(rpc agentbay.runs.v1.Runs/ListRuns '{"tenantId":"demo"}' || true)
    python3 - "$DEMO" <<'PY' && break
import json, sys
runs = json.loads(sys.argv[1] or "{}").get("runs", [])
waits = lambda r: any(a.get("pendingDecisionId") for s in r.get("steps", []) for a in s.get("attempts", []))
sys.exit(0 if len(runs) == 4 and all(r["state"] != "Running" or waits(r) for r in runs) else 1)
PY
    sleep 0.2
done
python3 - "$DEMO" <<'PY' || fail "the demo's runs: $DEMO"
import json, sys
runs = json.loads(sys.argv[1])["runs"]
waits = lambda r: any(a.get("pendingDecisionId") for s in r.get("steps", []) for a in s.get("attempts", []))
states = sorted(r["state"] + (" (waits for a person)" if waits(r) else "") for r in runs)
print("demo states:", states)
# One succeeds, one runs out of corrections, one waits for an approval,
# one for an answer.
assert states == ["Failed", "Running (waits for a person)", "Running (waits for a person)", "Succeeded"], states
PY

echo "--- the service stops, and an install over itself keeps the data"
wine net stop agentbay >/dev/null 2>&1 || fail "net stop agentbay"
echo "# edited on site" >> "$PROGRAM/agentbay.toml"
# The same version built again (a new product code), as a rebuilt package
# would be: it replaces the installed one.
cp "$MSI" "$TMP/again.msi"
wixl_product=$(msiinfo export "$TMP/again.msi" Property | tr -d '\r' | sed -n 's/^ProductCode\t//p')
python3 -c 'import uuid; print("{" + str(uuid.uuid4()).upper() + "}")' > "$TMP/code"
msiinfo export "$TMP/again.msi" Property | sed "s/$wixl_product/$(cat "$TMP/code")/" > "$TMP/Property.idt"
msibuild "$TMP/again.msi" -i "$TMP/Property.idt"
wine msiexec /i "$(winepath -w "$TMP/again.msi")" /qn /l*v "$(winepath -w "$TMP/upgrade.log")" ||
    { cat "$TMP/upgrade.log" | tail -40; fail "the install over itself failed"; }
wait_healthy
grep -q "edited on site" "$PROGRAM/agentbay.toml" || fail "the upgrade replaced the edited configuration"
TOKEN=$(token)
rpc agentbay.runs.v1.Runs/ListRuns '{"tenantId":"demo"}' | python3 -c 'import json,sys; sys.exit(0 if len(json.load(sys.stdin)["runs"]) == 4 else 1)' ||
    fail "the install over itself lost the data"
ls "$BACKUPS"/before-upgrade-* >/dev/null 2>&1 && fail "an install over the same version took an upgrade backup"

echo "--- a store of the previous schema: backed up before it is migrated"
CURRENT_SCHEMA=$(wine "$EXE" --version 2>/dev/null | tr -d '\r' | sed -n 's/.*(store schema \([0-9]*\)).*/\1/p')
[ -n "$CURRENT_SCHEMA" ] || fail "agentbay.exe --version does not name the store schema"
PREVIOUS=$((CURRENT_SCHEMA - 1))
wine net stop agentbay >/dev/null 2>&1 || fail "net stop agentbay"
mkdir -p "$TMP/previous"
tar -xzf "tests/fixtures/stores/schema-$PREVIOUS.tar.gz" -C "$TMP/previous"
mv "$DATA" "$TMP/data.upgraded"
cp -a "$TMP/previous/data" "$DATA"
wine net start agentbay >/dev/null 2>&1 || fail "net start agentbay with the previous schema's store"
wait_healthy
ls "$BACKUPS"/before-upgrade-from-*schema-$PREVIOUS-*.backup >/dev/null 2>&1 ||
    fail "no backup of the schema $PREVIOUS store in ProgramData\\agentbay\\backups"
curl -sS --cacert "$DATA/tls/ca.pem" "$URL/readyz" | python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["schemaVersion"] == int(sys.argv[1]) else 1)' "$CURRENT_SCHEMA" ||
    fail "the migrated store does not run at schema $CURRENT_SCHEMA"

echo "--- msiexec /x: the program and the service go, the data and the edited configuration stay"
wine msiexec /x "$(winepath -w "$TMP/again.msi")" /qn /l*v "$(winepath -w "$TMP/uninstall.log")" ||
    { cat "$TMP/uninstall.log" | tail -40; fail "msiexec /x failed"; }
[ ! -e "$PROGRAM/agentbay.exe" ] || fail "agentbay.exe is still installed"
wine sc query agentbay >/dev/null 2>&1 && fail "the service is still registered"
[ -d "$DATA/store" ] || fail "uninstalling deleted the data directory"
grep -q "edited on site" "$PROGRAM/agentbay.toml" 2>/dev/null || fail "uninstalling removed the edited configuration"
curl -fsS --cacert "$DATA/tls/ca.pem" "$URL/healthz" >/dev/null 2>&1 && fail "the appliance still serves after the uninstall"
echo "msi under Wine: ok in $(($(date +%s) - START)) s"
