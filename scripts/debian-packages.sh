#!/usr/bin/env bash
# The Debian/Ubuntu packages floe's quickstart and tests use, installed only when missing:
# README's install step, and called by scripts/test.sh and .ci/run. Checks first, so it leaves
# a Node that came from elsewhere (NodeSource's `nodejs` carries its own npm, and Debian's `npm`
# package conflicts with it) alone, and says what to do when a Node >= 20.6 cannot come from apt.
set -euo pipefail
SUDO=
# Only what must be installed needs root (sudo when not root); a machine with everything passes.
as_root() {
  if [ "$(id -u)" != 0 ] && [ -z "$SUDO" ]; then
    command -v sudo >/dev/null 2>&1 || { echo "[deps] not root and no sudo: run this as root to install $*" >&2; exit 1; }
    SUDO=sudo
  fi
}
missing=()
for pair in curl:curl openssl:openssl flock:util-linux python3:python3 dpkg-deb:dpkg apt-get:apt bwrap:bubblewrap; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
# Debian's system python3 ships venv/ensurepip separately (vLLM's venv needs them).
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
# cargo links with `cc`, and crates in Cargo.lock (ring, mimalloc) compile C: a minimal Debian
# has neither a compiler nor libc's headers.
command -v cc >/dev/null 2>&1 || missing+=(gcc)
[ -e /usr/include/stdio.h ] || missing+=(libc6-dev)

# `node --version` → 0 when it is at least 20.6 (what the harnesses need).
node_new_enough() { # VERSION (v20.6.0 or 20.6.0~dfsg-1)
  local v=${1#v}; v=${v#*:}; local major=${v%%.*}; local rest=${v#*.}; local minor=${rest%%[!0-9]*}
  [ "${major:-0}" -gt 20 ] 2>/dev/null || { [ "${major:-0}" = 20 ] && [ "${minor:-0}" -ge 6 ]; }
}
need_node=
if command -v node >/dev/null 2>&1; then
  # A Node without npm is Debian's, whose npm package fits it.
  command -v npm >/dev/null 2>&1 || missing+=(npm)
else
  need_node=1
fi

updated=
apt_update() { as_root "packages"; [ -n "$updated" ] || { $SUDO apt-get update -qq; updated=1; }; }
if [ -n "$need_node" ]; then
  apt_update
  candidate=$(apt-cache policy nodejs 2>/dev/null | awk '/Candidate:/ {print $2}')
  if [ -n "$candidate" ] && [ "$candidate" != "(none)" ] && node_new_enough "$candidate"; then
    missing+=(nodejs)
    # NodeSource's nodejs carries npm; Debian's wants the npm package.
    case "$candidate" in *nodesource*) ;; *) missing+=(npm) ;; esac
  else
    # Said after the rest is installed (curl among them, which NodeSource's and nvm's
    # installers need).
    no_node="Node >= 20.6 is not installed, and apt offers ${candidate:-none}: install Node 20.6 or newer (NodeSource's nodejs package, or nvm), then run this again"
  fi
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "[deps] installing ${missing[*]}" >&2
  as_root "${missing[*]}"
  apt_update
  $SUDO apt-get install -y -qq "${missing[@]}"
fi
if [ -n "${no_node:-}" ]; then
  echo "[deps] $no_node" >&2
  exit 1
fi
version=$(node --version)
node_new_enough "$version" || {
  echo "[deps] Node $version is older than 20.6, which the harnesses need: install Node 20.6 or newer (NodeSource's nodejs package, or nvm)" >&2
  exit 1
}
