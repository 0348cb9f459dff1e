#!/usr/bin/env bash
# Creates (once) and caches a Debian sid chroot with Godot 4 and a Python venv holding the
# bridge's dependencies, so the addon can run in real Godot on a host whose Debian is too old.
#
#   setup_chroot.sh            prints the chroot's directory (creating it the first time, and
#                              again when pyproject.toml's dependencies change)
#
# OAM_GODOT_CHROOT  where the chroot is cached (default /var/cache/oam-bridge/godot-sid)
# OAM_DEBIAN_MIRROR the Debian mirror (default http://deb.debian.org/debian)
# Needs root. The first run takes a few minutes (debootstrap ~3 min, godot ~1 min); later runs
# return at once. A half-made chroot is never used: it is built beside the cache and renamed.
set -euo pipefail
ROOT=${OAM_GODOT_CHROOT:-/var/cache/oam-bridge/godot-sid}
MIRROR=${OAM_DEBIAN_MIRROR:-http://deb.debian.org/debian}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
STAMP=.oam-godot-ready
log() { echo "setup_chroot: $*" >&2; }

# The bridge's runtime dependencies (pyproject.toml), one requirement a line. The stamp holds
# them: a chroot whose venv was made for other requirements is rebuilt, and so is one made by
# an earlier version of this script (an empty stamp), which lost their version bounds.
WANT=$(python3 - "$REPO/pyproject.toml" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
block = re.search(r'^dependencies = \[(.*?)\]', text, re.S | re.M).group(1)
print("\n".join(re.findall(r'"([^"]+)"', block)))
PY
)
mapfile -t DEPS <<< "$WANT"
# The Debian packages too: a chroot made without one of them is rebuilt.
PACKAGES="godot godot-template-release python3 python3-venv"
WANT="$WANT
apt: $PACKAGES"
ready() { [ -f "$ROOT/$STAMP" ] && [ "$(cat "$ROOT/$STAMP")" = "$WANT" ]; }

if ready; then echo "$ROOT"; exit 0; fi
[ "$(id -u)" = 0 ] || { log "needs root (debootstrap, chroot, mount)"; exit 2; }
mkdir -p "$(dirname "$ROOT")"
exec 9>"$ROOT.lock"
flock 9
if ready; then echo "$ROOT"; exit 0; fi   # another run made it meanwhile

if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap"
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >&2
fi

WORK="$ROOT.partial"
MOUNTS=()
cleanup() {
    local i
    for ((i=${#MOUNTS[@]}-1; i>=0; i--)); do umount -l "${MOUNTS[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
if [ ! -f "$WORK/.oam-debootstrap-done" ]; then
    rm -rf "$WORK"
    log "debootstrap --variant=minbase sid (a few minutes)"
    debootstrap --variant=minbase sid "$WORK" "$MIRROR" >&2
    touch "$WORK/.oam-debootstrap-done"
fi
for m in proc dev; do
    mkdir -p "$WORK/$m"
    if [ $m = proc ]; then mount -t proc proc "$WORK/proc"; else mount --bind /dev "$WORK/dev"; fi
    MOUNTS+=("$WORK/$m")
done
# sid's Release file can read as expired against a machine's clock.
echo 'Acquire::Check-Valid-Until "false";' > "$WORK/etc/apt/apt.conf.d/99oam-no-valid-until"
# The host's CA bundle (pip behind an intercepting proxy needs it).
mkdir -p "$WORK/etc/ssl/certs"
cp /etc/ssl/certs/ca-certificates.crt "$WORK/etc/ssl/certs/oam-host-ca.crt"
cp /etc/resolv.conf "$WORK/etc/resolv.conf" 2>/dev/null || true
log "apt-get install $PACKAGES"
chroot "$WORK" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    sh -c "apt-get update -qq && apt-get install -y -qq --no-install-recommends $PACKAGES" >&2
# The bridge's runtime dependencies, in a venv inside the chroot: each requirement is one
# argument, so its version bound reaches pip (unquoted, `>=0.25` is a shell redirection).
log "venv with: ${DEPS[*]}"
in_chroot() {
    chroot "$WORK" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
        PIP_CERT=/etc/ssl/certs/oam-host-ca.crt PIP_DISABLE_PIP_VERSION_CHECK=1 "$@" >&2
}
in_chroot python3 -m venv /opt/oam-venv
in_chroot /opt/oam-venv/bin/pip install -q "${DEPS[@]}"
# `oam-bridge` on PATH inside the chroot runs the checkout run_real.py bind-mounts at /oam/repo.
cat > "$WORK/usr/local/bin/oam-bridge" <<'SH'
#!/bin/sh
PYTHONPATH=/oam/repo${PYTHONPATH:+:$PYTHONPATH} exec /opt/oam-venv/bin/python -m bridge "$@"
SH
chmod +x "$WORK/usr/local/bin/oam-bridge"
mkdir -p "$WORK/oam/repo"
chroot "$WORK" godot --version >&2
cleanup; MOUNTS=()
printf '%s\n' "$WANT" > "$WORK/$STAMP"
rm -rf "$ROOT"
mv "$WORK" "$ROOT"
log "ready: $ROOT"
echo "$ROOT"
