#!/usr/bin/env bash
# Installs what `make images` needs from Debian for the platforms asked
# (comma-separated, e.g. linux/amd64,linux/arm64): dpkg-deb (reads glibc's
# .deb) and, for an arch other than this machine's, the cgo cross compiler
# (gcc-aarch64-linux-gnu or gcc-x86-64-linux-gnu). Does nothing when they
# are present; needs root (or sudo) otherwise.
set -euo pipefail
host=$(go env GOARCH)
pkgs=()
command -v dpkg-deb >/dev/null || pkgs+=(dpkg)
IFS=, read -ra platforms <<<"${1:-linux/amd64,linux/arm64}"
for p in "${platforms[@]}"; do
	arch=${p#linux/}
	[[ $arch == "$host" ]] && continue
	case $arch in
	arm64) cc=aarch64-linux-gnu-gcc pkg=gcc-aarch64-linux-gnu ;;
	amd64) cc=x86_64-linux-gnu-gcc pkg=gcc-x86-64-linux-gnu ;;
	*) echo "no cross compiler known for $p" >&2; exit 1 ;;
	esac
	command -v "$cc" >/dev/null || pkgs+=("$pkg")
done
((${#pkgs[@]})) || exit 0
sudo=()
[[ $(id -u) == 0 ]] || sudo=(sudo)
echo "installing Debian packages: ${pkgs[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get install -y --no-install-recommends "${pkgs[@]}" ||
	{ "${sudo[@]}" apt-get update && "${sudo[@]}" apt-get install -y --no-install-recommends "${pkgs[@]}"; }
