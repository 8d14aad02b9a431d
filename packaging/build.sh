#!/usr/bin/env bash
# Builds the installable artefacts from the locked dependencies:
#   target/packages/agentbay_<version>_amd64.deb   (dpkg-deb)
#   target/packages/agentbay-<version>-x64.msi     (wixl, when the Windows
#                                                   target is installed)
# Offline: `cargo vendor` first (see README, "Air-gapped build"); the build
# then needs no network.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
OUT=target/packages
mkdir -p "$OUT"

echo "--- agentbay $VERSION: release binary for Linux"
cargo build --release --locked --bin agentbay

echo "--- .deb"
ROOT="$OUT/deb/agentbay_${VERSION}_amd64"
rm -rf "$ROOT"
install -D -m 0755 target/release/agentbay "$ROOT/usr/bin/agentbay"
install -D -m 0640 packaging/agentbay.toml "$ROOT/etc/agentbay/agentbay.toml"
install -D -m 0644 packaging/debian/agentbay.service "$ROOT/lib/systemd/system/agentbay.service"
install -D -m 0644 README.md "$ROOT/usr/share/doc/agentbay/README.md"
install -D -m 0644 LICENSE "$ROOT/usr/share/doc/agentbay/copyright"
# The Python SDK and the wheels of its dependencies, for an offline
# `pip install /usr/share/agentbay/python/agentbay-*.whl`.
packaging/python/build-wheels.sh "$ROOT/usr/share/agentbay/python" linux-x86_64 >/dev/null
chmod 0644 "$ROOT"/usr/share/agentbay/python/*.whl
# The examples: releases to start from (README, "Releases"), the external
# adapter and the LangGraph graph that use the SDK.
(cd packaging/examples && find . -type f) | while read -r f; do
    install -D -m 0644 "packaging/examples/$f" "$ROOT/usr/share/doc/agentbay/examples/${f#./}"
done
# Alert rules for the site's Prometheus with their promtool unit tests, and
# the Grafana dashboard (README, "Alerts: metrics, rules and dashboard").
for f in packaging/prometheus/* packaging/grafana/*; do
    install -D -m 0644 "$f" "$ROOT/usr/share/agentbay/${f#packaging/}"
done
install -d "$ROOT/DEBIAN"
install -m 0755 packaging/debian/postinst packaging/debian/prerm packaging/debian/postrm "$ROOT/DEBIAN/"
echo "/etc/agentbay/agentbay.toml" > "$ROOT/DEBIAN/conffiles"
SIZE_KB=$(du -sk "$ROOT" --exclude=DEBIAN | cut -f1)
cat > "$ROOT/DEBIAN/control" <<CONTROL
Package: agentbay
Version: $VERSION
Architecture: amd64
Maintainer: agentbay <packaging@agentbay.invalid>
Depends: libc6 (>= 2.34), adduser, uidmap
Installed-Size: $SIZE_KB
Section: net
Priority: optional
Homepage: https://github.com/agentbay/agentbay
Description: on-prem runtime for AI agents
 One self-contained appliance: durable agent attempts, exact capacity
 accounting, verified releases, an embedded store, a web console and an
 HTTPS API (REST, Connect, gRPC). Runs as the hardened systemd service
 agentbay.service with its data in /var/lib/agentbay.
CONTROL
DEB="$OUT/agentbay_${VERSION}_amd64.deb"
dpkg-deb --root-owner-group -Zxz --build "$ROOT" "$DEB" >/dev/null
echo "built $DEB ($(du -h "$DEB" | cut -f1))"

echo "--- .msi"
TARGETS=$(rustup target list --installed 2>/dev/null || true)
if grep -qx x86_64-pc-windows-gnu <<<"$TARGETS" \
    && command -v x86_64-w64-mingw32-gcc >/dev/null && command -v wixl >/dev/null && command -v msibuild >/dev/null; then
    cargo build --release --locked --target x86_64-pc-windows-gnu --bin agentbay
    MSI="$OUT/agentbay-${VERSION}-x64.msi"
    # The same configuration, with the backups and the log where Windows
    # keeps program data (a service's standard error goes nowhere there).
    WINCONF="$OUT/agentbay-windows.toml"
    sed -e "s#^dir = \"/var/lib/agentbay-backups\"#dir = 'C:\\\\ProgramData\\\\agentbay\\\\backups'#" \
        -e "s#^\# dir = \"/var/log/agentbay\"#dir = 'C:\\\\ProgramData\\\\agentbay\\\\logs'#" \
        packaging/agentbay.toml > "$WINCONF"
    grep -q "^dir = 'C:.*logs'" "$WINCONF" || { echo "the Windows configuration sets no log.dir" >&2; exit 1; }
    # The Python SDK's wheels for Windows, beside the binary in python\.
    WHEELS="$OUT/python-windows"
    rm -rf "$WHEELS"
    packaging/python/build-wheels.sh "$WHEELS" windows-x86_64 >/dev/null
    WXS="$OUT/agentbay.wxs"
    python3 packaging/windows/with-files.py packaging/windows/agentbay.wxs "$WHEELS" packaging/examples > "$WXS"
    wixl --arch x64 -D Version="$VERSION" \
        -D Binary=target/x86_64-pc-windows-gnu/release/agentbay.exe \
        -D Config="$WINCONF" -D Readme=README.md \
        -D Prometheus=packaging/prometheus -D Grafana=packaging/grafana \
        -o "$MSI" "$WXS"
    # wixl does not know two settings: they are set in the MSI's tables.
    # set_table TABLE SED EXPECTED: edits one table's rows, checks the result.
    set_table() {
        msiinfo export "$MSI" "$1" > "$OUT/$1.idt"
        sed -i "$2" "$OUT/$1.idt"
        grep -q "$3" "$OUT/$1.idt" || { echo "msi: the $1 table is not as expected" >&2; exit 1; }
        msibuild "$MSI" -i "$OUT/$1.idt"
    }
    # An install over the same version upgrades too (reinstalling a build
    # keeps the data): the upgrade row's maximum version becomes inclusive
    # (msidbUpgradeAttributesVersionMaxInclusive, 0x200).
    set_table Upgrade 's/\t1\t\tWIX_UPGRADE_DETECTED/\t513\t\tWIX_UPGRADE_DETECTED/' $'\t513\t\tWIX_UPGRADE_DETECTED'
    # The configuration the site edits survives an upgrade (which removes
    # the installed product first) and an uninstall, and is never
    # overwritten: its component is Permanent (0x10) and NeverOverwrite
    # (0x80) beside 64-bit (0x100).
    set_table Component 's/^\(Configuration\t{[0-9A-F-]*}\tINSTALLDIR\t\)256\t/\1400\t/' \
        $'^Configuration\t{[0-9A-F-]*}\tINSTALLDIR\t400\t'
    echo "built $MSI ($(du -h "$MSI" | cut -f1))"
else
    echo "msi: skipped: needs the x86_64-pc-windows-gnu target, mingw-w64, wixl and msitools (rustup target add x86_64-pc-windows-gnu; apt-get install mingw-w64 wixl msitools)"
fi
