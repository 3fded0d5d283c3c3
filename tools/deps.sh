#!/usr/bin/env bash
# tools/deps.sh — install the Debian packages kiln needs (once; a no-op when
# they are all there).  Runs as root on a fresh Debian 12 machine.
set -eu
pkgs="build-essential clang libclang-rt-14-dev llvm-14-dev liblua5.4-dev libopenblas-dev
      libopenmpi-dev openmpi-bin libcmocka-dev libjansson-dev python3-torch python3-numpy base-files"
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "installing:$missing"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
