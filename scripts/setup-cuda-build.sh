#!/usr/bin/env bash
# Makes `--features cuda` build without downloading anything at build time.
#
# Burn 0.22's `cuda` feature links cubecl-cuda 0.11.3 -> cubecl-llvm -> llvm-sys through
# tracel-llvm-bundler, whose build script downloads a prebuilt LLVM into
# $HOME/.local/share/tracel/tracel-llvm-23.1.0-4 unless a sentinel file is already there.
# Debian's LLVM 22 links in its place (../shared/notes/cuda-offline.md). At run time cubecl
# compiles its kernels to PTX through that LLVM's NVPTX backend, so the linked LLVM is also the
# GPU code generator. The CUDA driver (libcuda) is needed only where the binaries run.
#
# Idempotent; needs root for apt-get and for one symlink in /usr/lib (the bundler turns
# llvm-config's `/usr/lib/x86_64-linux-gnu/libz3.so` into `-llibz3`).
set -euo pipefail

packages=(llvm-22-dev libpolly-22-dev libzstd-dev libz3-dev)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    if [[ $(id -u) != 0 ]]; then
        echo "setup-cuda-build: needs root to install ${missing[*]} (apt-get)" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

llvm=/usr/lib/llvm-22
bundle="${HOME}/.local/share/tracel/tracel-llvm-23.1.0-4"
mkdir -p "$bundle"
for x in bin lib include share; do
    ln -sfn "$llvm/$x" "$bundle/$x"
done
touch "$bundle/.tracel-llvm-installed"

z3=/usr/lib/x86_64-linux-gnu/libz3.so
if [[ -e $z3 && ! -e /usr/lib/x86_64-linux-gnu/liblibz3.so ]]; then
    if [[ $(id -u) != 0 ]]; then
        echo "setup-cuda-build: needs root to link $z3 as liblibz3.so" >&2
        exit 1
    fi
    ln -s "$z3" /usr/lib/x86_64-linux-gnu/liblibz3.so
fi
echo "setup-cuda-build: LLVM 22 stands in for the tracel bundle at $bundle"
