#!/usr/bin/env bash
# cloud-init user-data: turns a fresh Debian or Ubuntu spot VM into a Parcae-rs node.
#
# Give it to the VM as user data (e.g. `aws ec2 run-instances --user-data file://cloud-init.sh`,
# `gcloud compute instances create --metadata-from-file user-data=cloud-init.sh`, or Azure's
# `--custom-data`) after filling in the settings below, or set them in the environment. It
# downloads the release (the binary, its .sha256 and parcae-node.service) from
# PARCAE_RELEASE_URL, checks the binary's digest, writes the cluster key and an environment
# file, and starts the node under systemd. The node detects the cloud by itself and polls its
# metadata service for preemption notices (`--notice auto`).
#
# PARCAE_PREFIX installs under a directory instead of / and neither creates the user nor
# touches systemd: that is how the project's tests run this script.
set -euo pipefail

# ---- settings -------------------------------------------------------------------------------
# Where the release lies (https://, s3 presigned, or file:// for tests).
PARCAE_RELEASE_URL="${PARCAE_RELEASE_URL:-https://example.invalid/parcae/v0.1.0}"
# The cluster key: the 64 hex digits of the file `parcae-node keygen --out cluster.key` wrote.
PARCAE_CLUSTER_KEY_HEX="${PARCAE_CLUSTER_KEY_HEX:-}"
# Seeds, comma-separated, no peer id needed (e.g. /dns4/parcae-0.internal/tcp/7000); empty on
# the one VM that founds the cluster.
PARCAE_BOOTSTRAP="${PARCAE_BOOTSTRAP:-}"
# Ports of the node (libp2p) and of its HTTP server (/status, /metrics, /healthz, /readyz).
PARCAE_PORT="${PARCAE_PORT:-7000}"
PARCAE_HTTP_PORT="${PARCAE_HTTP_PORT:-9000}"
# Optional: a node configuration (TOML), base64-encoded.
PARCAE_CONFIG_B64="${PARCAE_CONFIG_B64:-}"
# ---------------------------------------------------------------------------------------------

PREFIX="${PARCAE_PREFIX:-}"
ETC="$PREFIX/etc/parcae"
BIN="$PREFIX/usr/local/bin"
UNIT_DIR="$PREFIX/etc/systemd/system"
DATA="$PREFIX/var/lib/parcae"

die() {
    echo "parcae cloud-init: $*" >&2
    exit 1
}

[[ "$PARCAE_CLUSTER_KEY_HEX" =~ ^[0-9a-fA-F]{64}$ ]] ||
    die "PARCAE_CLUSTER_KEY_HEX must be the 64 hex digits of a key made by parcae-node keygen"
[[ "$PARCAE_PORT" =~ ^[0-9]+$ && "$PARCAE_HTTP_PORT" =~ ^[0-9]+$ ]] ||
    die "PARCAE_PORT and PARCAE_HTTP_PORT must be port numbers"

fetch() {
    curl --fail --silent --show-error --location --retry 5 --retry-delay 2 \
        --output "$2" "$PARCAE_RELEASE_URL/$1"
}

if [[ -z "$PREFIX" ]]; then
    export DEBIAN_FRONTEND=noninteractive
    command -v curl >/dev/null || { apt-get update -q && apt-get install -yq curl ca-certificates; }
    id parcae >/dev/null 2>&1 || useradd --system --home-dir /var/lib/parcae --shell /usr/sbin/nologin parcae
fi

mkdir -p "$ETC" "$BIN" "$UNIT_DIR" "$DATA"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fetch parcae-node "$work/parcae-node"
fetch parcae-node.sha256 "$work/parcae-node.sha256"
fetch parcae-node.service "$work/parcae-node.service"
expected="$(cut -d' ' -f1 <"$work/parcae-node.sha256")"
actual="$(sha256sum "$work/parcae-node" | cut -d' ' -f1)"
[[ "$expected" == "$actual" ]] || die "parcae-node digest $actual does not match the release's $expected"
install -m 0755 "$work/parcae-node" "$BIN/parcae-node"
install -m 0644 "$work/parcae-node.service" "$UNIT_DIR/parcae-node.service"

umask 077
printf '%s\n' "$PARCAE_CLUSTER_KEY_HEX" >"$ETC/cluster.key"
cat >"$ETC/parcae.env" <<ENV
PARCAE_DATA_DIR=/var/lib/parcae
PARCAE_LISTEN=/ip4/0.0.0.0/tcp/$PARCAE_PORT
PARCAE_STATUS_ADDR=0.0.0.0:$PARCAE_HTTP_PORT
PARCAE_CLUSTER_KEY=/etc/parcae/cluster.key
PARCAE_NOTICE=auto
ENV
if [[ -n "$PARCAE_BOOTSTRAP" ]]; then
    echo "PARCAE_BOOTSTRAP=$PARCAE_BOOTSTRAP" >>"$ETC/parcae.env"
fi
if [[ -n "$PARCAE_CONFIG_B64" ]]; then
    printf '%s' "$PARCAE_CONFIG_B64" | base64 --decode >"$ETC/node.toml"
    echo "PARCAE_CONFIG=/etc/parcae/node.toml" >>"$ETC/parcae.env"
fi

if [[ -z "$PREFIX" ]]; then
    chown -R parcae:parcae "$ETC" "$DATA"
    systemctl daemon-reload
    systemctl enable --now parcae-node.service
fi
echo "parcae cloud-init: node installed${PREFIX:+ under $PREFIX}"
