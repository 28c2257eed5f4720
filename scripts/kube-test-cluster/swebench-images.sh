#!/usr/bin/env bash
# The real node's SWE-bench images (tests/real_node/swebench.rs), built from this machine's files
# like images.sh's and imported into the node's containerd:
#   floe.local/swebench-grader:<k>    the python sandbox plus the pinned `swebench` package
#                                     (scripts/swebench/install.sh's), as
#                                     deploy/swebench-grader/Dockerfile builds it
#   floe.local/sweb.eval.<id>:<k>     an instance's image as the public ones are: the python
#                                     sandbox plus git, bash and pytest, a no-op
#                                     /opt/miniconda3/bin/activate, the repository at its
#                                     base commit in /testbed (its whole history kept, later
#                                     commits and tags included), and an environment of root's
#                                     that the eval script installs into (/opt/site, holding
#                                     the base commit's calc.py), as Django 1.x's images are
#
#   swebench-images.sh STATE_DIR SWEBENCH_DIR INSTANCE_ID REPOSITORY
#     -> prints "grader=NAME" and "instance=NAME"
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
D=$(realpath -m "${1:?usage: swebench-images.sh STATE_DIR SWEBENCH_DIR INSTANCE_ID REPOSITORY}")
SWE=${2:?}; ID=${3:?}; REPO=$(realpath "${4:?}")
CACHE=${FLOE_CACHE:-$HOME/.cache/floe}/node-images-r2
CTR=(ctr --address "$D/containerd/containerd.sock" -n k8s.io)
. "$HERE/image-lib.sh"
mkdir -p "$CACHE" "$D/images"
exec 7>"$CACHE/.lock"; flock 7
have=$("${CTR[@]}" images ls -q)
import() { grep -qx "$2" <<<"$have" || "${CTR[@]}" images import "$1" >/dev/null; }
SITE=$(echo "$SWE"/venv/lib/python3.*/site-packages)

# The grader: keyed by the swebench install (its directory name is its pins' key).
G_TAG=$(echo "r2-${SWE##*/}" | sha256sum | cut -c1-16)
G_IMAGE=floe.local/swebench-grader:$G_TAG
G_TAR=$CACHE/swebench-grader-$G_TAG.tar
if [ ! -f "$G_TAR" ]; then
  R=$CACHE/swebench-grader-root
  python_root "$R"
  mkdir -p "$R/usr/local/lib/python3.11/dist-packages"
  tar -C "$SITE" --exclude='__pycache__' --exclude='pip' --exclude='pip-*' -cf - . \
    | tar -C "$R/usr/local/lib/python3.11/dist-packages" -xf -
  # The extensions' own libraries (numpy's libstdc++, …) where a wheel does not bundle them.
  extension_libs "$R" "$R/usr/local/lib/python3.11/dist-packages"
  python3 "$HERE/mkimage.py" "$G_TAR.part" "$G_IMAGE" "$R" --cmd /usr/bin/python3 --user 65532:65532 >&2
  mv "$G_TAR.part" "$G_TAR"
  rm -rf "$R"
fi
import "$G_TAR" "$G_IMAGE"

# The instance: small, built each time from REPOSITORY (tagged by its content).
I_TAG=$( (echo r3; git -C "$REPO" rev-parse HEAD; cd "$REPO" && tar --sort=name --mtime=@0 -cf - . | sha256sum) | sha256sum | cut -c1-16)
I_IMAGE=floe.local/sweb.eval.$ID:$I_TAG
if ! grep -qx "$I_IMAGE" <<<"$have"; then
  R=$D/images/instance-root
  python_root "$R"
  rm -f "$R/bin/bash"
  with_libs "$R" /bin/bash
  GIT=$(command -v git)
  with_libs "$R" "$GIT"
  EXEC=$(git --exec-path)
  mkdir -p "$R$EXEC"
  for f in "$EXEC"/*; do
    if [ -f "$f" ] && head -c4 "$f" | grep -q 'ELF'; then with_libs "$R" "$f"; fi
  done
  # git's own binary under PATH where the image's shell looks first.
  [ -e "$R/usr/bin/git" ] || ln -s "$GIT" "$R/usr/bin/git"
  mkdir -p "$R/usr/local/lib/python3.11/dist-packages"
  T=$(echo "$SWE"/testbed/lib/python3.*/site-packages)
  for p in _pytest pytest py.py pluggy iniconfig packaging pygments; do cp -a "$T/$p" "$R/usr/local/lib/python3.11/dist-packages/"; done
  mkdir -p "$R/opt/miniconda3/bin"
  printf '# The public images activate their conda environment here; this one has none.\nconda() { :; }\n' > "$R/opt/miniconda3/bin/activate"
  cp -a "$REPO" "$R/testbed"
  mkdir -p "$R/opt/site"
  cp "$REPO/calc.py" "$R/opt/site/calc.py"
  python3 "$HERE/mkimage.py" "$D/images/instance.tar" "$I_IMAGE" "$R" --cmd /bin/sh --user 1000:1000 --workdir /testbed >&2
  "${CTR[@]}" images import "$D/images/instance.tar" >/dev/null
  rm -rf "$R" "$D/images/instance.tar"
fi
echo "grader=$G_IMAGE"
echo "instance=$I_IMAGE"
