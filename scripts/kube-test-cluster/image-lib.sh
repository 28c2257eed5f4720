# Functions the node's image scripts share (sourced by images.sh and swebench-images.sh).
# PY: the host's python3.11, which the python sandbox is made of.
PY=/usr/bin/python3.11

# Copy FILE and the shared libraries it loads (ldd's closure) into ROOT, at the same paths.
with_libs() {
  local root=$1 f=$2
  cp -L --parents "$f" "$root/"
  ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | while read -r lib; do
    [ -e "$root$lib" ] || cp -L --parents "$lib" "$root/"
  done
}
# Copy into ROOT the shared libraries that the extension modules (*.so*) under DIR load.
extension_libs() {
  local root=$1 dir=$2
  find "$dir" -name '*.so*' -type f | while read -r so; do
    { ldd "$so" 2>/dev/null || true; } | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r lib; do
      [ -e "$root$lib" ] || cp -L --parents "$lib" "$root/"
    done
  done
}
# The python sandbox's files under ROOT.
python_root() {
  local R=$1
  rm -rf "$R"; mkdir -p "$R"/{bin,etc,tmp,home/user,usr/bin,workspace}
  chmod 1777 "$R/tmp" "$R/home/user"
  with_libs "$R" "$PY"
  # As in Debian's and the official python images (and what the copied-in floe binary needs).
  cp -L --parents /lib/x86_64-linux-gnu/libgcc_s.so.1 "$R/"
  tar -C / --exclude='__pycache__' --exclude='python3.11/test' --exclude='python3.11/idlelib' \
    --exclude='python3.11/tkinter' --exclude='python3.11/ensurepip' --exclude='python3.11/lib2to3' \
    -cf - usr/lib/python3.11 | tar -C "$R" -xf -
  extension_libs "$R" "$R/usr/lib/python3.11/lib-dynload"
  ln -s python3.11 "$R/usr/bin/python3"; ln -s python3.11 "$R/usr/bin/python"
  cp /bin/busybox "$R/bin/busybox"
  for a in $("$R/bin/busybox" --list); do [ -e "$R/bin/$a" ] || ln -s busybox "$R/bin/$a"; done
  ln -s /bin/busybox "$R/usr/bin/env"   # `#!/usr/bin/env node` scripts (Pi's CLI)
  printf 'root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n' > "$R/etc/passwd"
  printf 'root:x:0:\nuser:x:1000:\n' > "$R/etc/group"
}
