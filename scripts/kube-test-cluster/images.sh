#!/usr/bin/env bash
# Images for the real node, built from this machine's files (no registry, no builder) and
# imported into the node's containerd:
#   floe.local/floe:<hash>        the `floe` binary (operator, gateway sidecar, floe-init,
#                                 collector) with the shared libraries it links, USER 65532 —
#                                 the layout of the Dockerfile's image (/usr/local/bin/floe)
#   floe.local/python-sandbox:<v> Debian's python3.11 with its standard library and
#                                 libraries, busybox for the shell tools, USER 1000
#   floe.local/harness-sandbox:<v> the python sandbox plus this machine's Node.js and the five
#                                 harness CLIs from npm (scripts/harnesses/install.sh),
#                                 unmodified: pi, codex, claude, qwen, gemini on PATH
#
#   images.sh STATE_DIR FLOE_BIN  -> prints "floe=NAME", "python=NAME" and "harnesses=NAME" (images
#                                    already in the node are not imported again)
#
# The floe binary built here links glibc (>= 2.34: Debian 12, Ubuntu 22.04 and later) and
# libgcc_s: the sandbox pods' init container copies it into the harness image, so harness images
# need both (every glibc distribution image has them). The Dockerfile builds a static (musl) binary that runs in any image.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
D=$(realpath -m "${1:?usage: images.sh STATE_DIR FLOE_BIN}")
FLOE_BIN=${2:?usage: images.sh STATE_DIR FLOE_BIN}
CACHE=${FLOE_CACHE:-$HOME/.cache/floe}/node-images-r2
CTR=(ctr --address "$D/containerd/containerd.sock" -n k8s.io)
log() { echo "[images $(date +%T)] $*" >&2; }
if [ ! -x /bin/busybox ] || ! /bin/busybox --list >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends busybox-static >/dev/null \
    || { apt-get update -qq >/dev/null 2>&1; DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends busybox-static >/dev/null; }
fi
mkdir -p "$CACHE" "$D/images"
exec 7>"$CACHE/.lock"; flock 7

. "$HERE/image-lib.sh"
have=$("${CTR[@]}" images ls -q)
import() { grep -qx "$2" <<<"$have" || "${CTR[@]}" images import "$1" >/dev/null; }

# floe: tagged by the stripped binary's hash, so a rebuilt binary is a new image.
STRIPPED=$D/images/floe.stripped
objcopy --strip-debug "$FLOE_BIN" "$STRIPPED"
TAG=$(sha256sum "$STRIPPED" | cut -c1-12)
FLOE_IMAGE=floe.local/floe:$TAG
if ! grep -qx "$FLOE_IMAGE" <<<"$have"; then
  R=$D/images/floe-root; rm -rf "$R"; mkdir -p "$R/etc" "$R/tmp" "$R/usr/local/bin"
  chmod 1777 "$R/tmp"
  install -m 0755 "$STRIPPED" "$R/usr/local/bin/floe"
  with_libs "$R" "$R/usr/local/bin/floe"
  # with_libs copied the binary again under its own path: keep only /usr/local/bin/floe.
  rm -rf "${R:?}${R}"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$R/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' > "$R/etc/group"
  python3 "$HERE/mkimage.py" "$D/images/floe.tar" "$FLOE_IMAGE" "$R" --entrypoint floe --user 65532:65532 >&2
  import "$D/images/floe.tar" "$FLOE_IMAGE"
  rm -rf "$R" "$D/images/floe.tar"
  log "$FLOE_IMAGE imported"
fi
rm -f "$STRIPPED"

# python: cached by the interpreter's version (rebuilt when Debian's python3.11 changes).
PY_VERSION=$(dpkg-query -W -f='${Version}' python3.11-minimal 2>/dev/null || "$PY" -V)
PY_TAG=$(echo "$PY_VERSION" | tr -c 'A-Za-z0-9.\n' '-')
PY_IMAGE=floe.local/python-sandbox:$PY_TAG
PY_TAR=$CACHE/python-sandbox-$PY_TAG.tar
if [ ! -f "$PY_TAR" ]; then
  R=$CACHE/python-root
  python_root "$R"
  python3 "$HERE/mkimage.py" "$PY_TAR.part" "$PY_IMAGE" "$R" --cmd /usr/bin/python3 --user 1000:1000 --workdir /workspace >&2
  mv "$PY_TAR.part" "$PY_TAR"
  rm -rf "$R"
fi
import "$PY_TAR" "$PY_IMAGE"

# harnesses: cached by the five harness CLIs' versions and Node's (and the python sandbox's
# under it). Each CLI unmodified from npm (scripts/harnesses/install.sh) under /opt/<name>, its
# command on PATH; native binaries (Claude Code's) with the libraries they load; Debian's bash.
HARNESSES="pi codex claude-code qwen-code gemini-cli"
rm -f "$CACHE"/pi-sandbox-*.tar   # the Pi-only image this one replaced
NODE=$(command -v node)
NODE_VERSION=$("$NODE" --version)
H_TAG=""
declare -A H_BIN
for h in $HARNESSES; do
  BIN=$("$HERE/../harnesses/install.sh" "$h")
  H_BIN[$h]=$BIN
  H_DIR=$(cd "$(dirname "$BIN")/../.." && pwd)   # .../harnesses/<name>-<version>
  H_TAG="$H_TAG-${H_DIR##*/}"
done
BASH_VERSION_DEB=$(dpkg-query -W -f='${Version}' bash 2>/dev/null || bash --version | head -1)
# r2: bash added. Bump it when what goes in changes.
H_IMAGE=floe.local/harness-sandbox:$(echo "r2${H_TAG}-node${NODE_VERSION#v}-py$PY_TAG-bash$BASH_VERSION_DEB" | sha256sum | cut -c1-16)
H_TAR=$CACHE/harness-sandbox-${H_IMAGE##*:}.tar
if [ ! -f "$H_TAR" ]; then
  R=$CACHE/harness-root
  python_root "$R"
  mkdir -p "$R/usr/local/bin" "$R/opt"
  install -m 0755 "$NODE" "$R/usr/local/bin/node"
  with_libs "$R" "$R/usr/local/bin/node"
  rm -rf "${R:?}${R}"
  # Claude Code, Qwen Code and Gemini CLI run their shell tool with bash (busybox's sh is not
  # enough: "No suitable shell found", "spawn bash ENOENT").
  rm -f "$R/bin/bash"
  with_libs "$R" /bin/bash
  for h in $HARNESSES; do
    BIN=${H_BIN[$h]}
    H_DIR=$(cd "$(dirname "$BIN")/../.." && pwd)
    cp -a "$H_DIR" "$R/opt/$h"
    ln -s "/opt/$h/node_modules/.bin/${BIN##*/}" "$R/usr/local/bin/${BIN##*/}"
    # ldd prints nothing useful for a script (node's own libraries are in already).
    { ldd "$(readlink -f "$BIN")" 2>/dev/null || true; } | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | while read -r lib; do
      [ -e "$R$lib" ] || cp -L --parents "$lib" "$R/"
    done
  done
  python3 "$HERE/mkimage.py" "$H_TAR.part" "$H_IMAGE" "$R" --cmd /usr/local/bin/pi --user 1000:1000 --workdir /workspace >&2
  mv "$H_TAR.part" "$H_TAR"
  rm -rf "$R"
fi
import "$H_TAR" "$H_IMAGE"
echo "floe=$FLOE_IMAGE"
echo "python=$PY_IMAGE"
echo "harnesses=$H_IMAGE"

# trainer (only with FLOE_TRAINER_PYTHON, the vLLM venv's python from scripts/vllm-cpu/setup.sh):
# the venv's base interpreter with its standard library, the system libraries the venv's native
# modules load, lscpu (vLLM reads the CPU topology with it), busybox, floe_trainer, and the
# three commands the trainer pod runs (`vllm`, `torchrun`, `floe-trainer`). The venv itself
# (~6 GB: torch's CUDA build loads its CUDA libraries even on CPU) is not copied: it comes from
# the pod's model volume, a read-only hostPath PersistentVolume of this cache, at
# /models/<venv>. Only a test can do that; a real trainer image is trainer/Dockerfile's.
if [ -n "${FLOE_TRAINER_PYTHON:-}" ]; then
  VENV=$(cd "$(dirname "$FLOE_TRAINER_PYTHON")/.." && pwd)
  BASE_PY=$(readlink -f "$VENV/bin/python3")
  BASE_PREFIX=$(cd "$(dirname "$BASE_PY")/.." && pwd)
  STDLIB=$(ls -d "$BASE_PREFIX"/lib/python3.*/ | head -1)
  SRC=$HERE/../../trainer/floe_trainer
  T_SUM=$( (echo "${VENV##*/} $BASE_PY"; cat "$0"; cd "$SRC" && find . -name '*.py' | sort | xargs cat) | sha256sum | cut -c1-16)
  T_IMAGE=floe.local/trainer:$T_SUM
  T_TAR=$CACHE/trainer-$T_SUM.tar
  if [ ! -f "$T_TAR" ]; then
    R=$CACHE/trainer-root
    rm -rf "$R"; mkdir -p "$R"/{bin,etc,tmp,home/user,usr/local/bin,opt/floe-trainer,models}
    chmod 1777 "$R/tmp" "$R/home/user"
    with_libs "$R" "$BASE_PY"
    # The venv's own link (bin/python3 -> the base's python3, itself a link) resolves in the image.
    LINK=$(readlink "$VENV/bin/python3")
    if [ "$LINK" != "$BASE_PY" ] && [ "${LINK#/}" != "$LINK" ]; then
      mkdir -p "$R$(dirname "$LINK")"; ln -sf "$BASE_PY" "$R$LINK"
    fi
    tar -C / --exclude='__pycache__' --exclude='site-packages' --exclude='test' --exclude='idlelib' \
      --exclude='tkinter' --exclude='ensurepip' -cf - "${STDLIB#/}" | tar -C "$R" -xf -
    cp /bin/busybox "$R/bin/busybox"
    for a in $("$R/bin/busybox" --list); do [ -e "$R/bin/$a" ] || ln -s busybox "$R/bin/$a"; done
    with_libs "$R" "$(command -v lscpu)"
    # The system libraries of every native module in the venv (and of the stdlib's own).
    find "$VENV" "$STDLIB" -name '*.so*' -type f 2>/dev/null | while read -r so; do
      ldd "$so" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
    done | grep -v "^$VENV/" | sort -u | while read -r lib; do
      [ -e "$R$lib" ] || cp -L --parents "$lib" "$R/"
    done
    # cp --parents made the interpreter's parents as the host has them (/root: 0700): the
    # image's user must reach it.
    chmod -R a+rX "$R"
    cp -r "$SRC" "$R/opt/floe-trainer/"
    find "$R/opt/floe-trainer" -name __pycache__ -prune -exec rm -rf {} +
    PY_IN_POD=/models/${VENV##*/}/bin/python
    # TORCHDYNAMO_DISABLE: vLLM's CPU sampler compiles a helper with torch.compile, which needs a
    # C++ compiler (inductor) that this image does not carry; eager gives the same tokens.
    env_lines="export TORCHDYNAMO_DISABLE=1 HOME=\${HOME:-/home/user} PYTHONPATH=/opt/floe-trainer HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 VLLM_CPU_KVCACHE_SPACE=\${VLLM_CPU_KVCACHE_SPACE:-1}"
    # `vllm serve MODEL ARGS`: the package is vllm-cpu, so its module entry point.
    printf '#!/bin/sh\n%s\n[ "$1" = serve ] || exec %s -m vllm.entrypoints.cli.main "$@"\nshift; model=$1; shift\nexec %s -m vllm.entrypoints.openai.api_server --model "$model" "$@"\n' \
      "$env_lines" "$PY_IN_POD" "$PY_IN_POD" > "$R/usr/local/bin/vllm"
    printf '#!/bin/sh\n%s\nexec %s -m torch.distributed.run "$@"\n' "$env_lines" "$PY_IN_POD" > "$R/usr/local/bin/torchrun"
    printf '#!/bin/sh\n%s\nexec %s -m floe_trainer.cli "$@"\n' "$env_lines" "$PY_IN_POD" > "$R/usr/local/bin/floe-trainer"
    chmod 0755 "$R"/usr/local/bin/*
    printf 'root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n' > "$R/etc/passwd"
    printf 'root:x:0:\nuser:x:1000:\n' > "$R/etc/group"
    python3 "$HERE/mkimage.py" "$T_TAR.part" "$T_IMAGE" "$R" --user 1000:1000 --workdir /home/user >&2
    mv "$T_TAR.part" "$T_TAR"
    rm -rf "$R"
    log "$T_IMAGE built ($(du -h "$T_TAR" | cut -f1))"
  fi
  import "$T_TAR" "$T_IMAGE"
  echo "trainer=$T_IMAGE"
  echo "trainer-volume=$(dirname "$VENV")"
fi
