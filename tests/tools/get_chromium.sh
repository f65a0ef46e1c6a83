#!/usr/bin/env bash
# Fetch Debian's headless Chromium into a cache inside the repo, without root and without installing
# anything system-wide: `apt-get download` the package and every dependency this machine lacks, then
# unpack them with `dpkg -x`. Prints the path of the browser binary on its last line.
#
#   bash tests/tools/get_chromium.sh            # -> .cache/chromium/root/usr/lib/chromium/chromium-headless-shell
#
# Why not Playwright / puppeteer: their browser downloads come from a CDN this project cannot reach;
# Debian's archive is reachable wherever `apt-get` works (CI included).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${AWM_CHROMIUM_CACHE:-$ROOT/.cache/chromium}"
PKG=chromium-headless-shell
BIN="$CACHE/root/usr/lib/chromium/chromium-headless-shell"

libpath() {
  # every folder of the unpacked tree that holds shared libraries
  find "$CACHE/root" -name '*.so*' -printf '%h\n' 2>/dev/null | sort -u | paste -sd: -
}

missing_libs() {
  LD_LIBRARY_PATH="$(libpath)" ldd "$BIN" 2>/dev/null | awk '/not found/ {print $1}' | sort -u
}

if [[ -x "$BIN" && -z "$(missing_libs)" ]]; then
  echo "$BIN"
  exit 0
fi

command -v apt-get >/dev/null || { echo "get_chromium.sh: needs apt-get (a Debian/Ubuntu machine)" >&2; exit 2; }
if [[ ! "$(apt-cache policy "$PKG" 2>/dev/null)" =~ Candidate:\ [0-9] ]]; then
  # a fresh machine (CI) may have no package lists yet: refreshing them installs nothing
  if [[ "$(id -u)" == 0 ]]; then
    apt-get update -qq >&2 || true
  fi
  if [[ ! "$(apt-cache policy "$PKG" 2>/dev/null)" =~ Candidate:\ [0-9] ]]; then
    echo "get_chromium.sh: apt knows no '$PKG': run 'sudo apt-get update' (Debian bookworm has it in main)" >&2
    exit 3
  fi
fi
mkdir -p "$CACHE/debs" "$CACHE/root"
cd "$CACHE/debs"

# The dependency closure, minus what is installed already (Depends and PreDepends only).
mapfile -t closure < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
  --no-replaces --no-enhances "$PKG" | awk '/^[a-z0-9]/ {print $1}' | sed 's/:any$//' | sort -u)
wanted=()
for p in "${closure[@]}"; do
  status="$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)"
  [[ "$status" == "install ok installed" ]] && continue
  # virtual packages have no candidate: skip them, their providers are in the closure
  policy="$(apt-cache policy "$p" 2>/dev/null || true)"
  [[ "$policy" =~ Candidate:\ [0-9] ]] && wanted+=("$p")
done
echo "get_chromium.sh: downloading ${#wanted[@]} packages into $CACHE/debs" >&2
apt-get download "${wanted[@]}" >/dev/null 2>"$CACHE/apt.err" || true
for p in "${wanted[@]}"; do
  if ! ls "$p"_*.deb >/dev/null 2>&1; then
    cat "$CACHE/apt.err" >&2
    echo "get_chromium.sh: 'apt-get download $p' failed; if the package lists are stale run" \
         "'apt-get update' (as root) and try again" >&2
    exit 3
  fi
done
for deb in ./*.deb; do dpkg -x "$deb" "$CACHE/root"; done
rm -f ./*.deb  # unpacked: the archives are not needed again

left="$(missing_libs)"
if [[ -n "$left" ]]; then
  echo "get_chromium.sh: $BIN still misses shared libraries: $left" >&2
  exit 4
fi
echo "$BIN"
