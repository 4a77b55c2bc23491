#!/usr/bin/env bash
# Makes `--features cube-cpu` run: Burn's Cube backend on this CPU is wgpu on Mesa's lavapipe
# (llvmpipe's Vulkan driver), from Debian's packages. Nothing else is downloaded: the Rust side is
# Burn's `wgpu` feature, from crates.io like the rest.
#
# Mesa comes from bookworm-backports (25.x): bookworm's own lavapipe (22.3.6) crashed compiling
# cubek's matmul kernels (a SIGSEGV inside vkCreateComputePipelines, 2026-12-06). The script adds
# that suite to apt's sources where it is missing.
#
# Idempotent; needs root for apt-get. `vulkaninfo --summary` (vulkan-tools) then lists `llvmpipe`
# as a device of type PHYSICAL_DEVICE_TYPE_CPU.
set -euo pipefail

want=25
installed=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)
if [[ ${installed%%.*} != "$want" ]] || ! dpkg-query -W -f='${Status}' libvulkan1 2>/dev/null \
        | grep -q "install ok installed"; then
    if [[ $(id -u) != 0 ]]; then
        echo "setup-cube-cpu: needs root to install mesa-vulkan-drivers $want.x (apt-get)" >&2
        exit 1
    fi
    sources=/etc/apt/sources.list.d/bookworm-backports.sources
    if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d; then
        printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
            > "$sources"
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libvulkan1 >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t bookworm-backports \
        mesa-vulkan-drivers >/dev/null
fi
icd=$(ls /usr/share/vulkan/icd.d/lvp_icd*.json 2>/dev/null | head -1)
if [[ -z $icd ]]; then
    echo "setup-cube-cpu: no lavapipe ICD under /usr/share/vulkan/icd.d" >&2
    exit 1
fi
echo "setup-cube-cpu: lavapipe $(dpkg-query -W -f='${Version}' mesa-vulkan-drivers) ($icd)"
