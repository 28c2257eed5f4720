#!/usr/bin/env python3
"""Assemble a single-layer OCI image archive (for `ctr -n k8s.io images import`) from a directory,
by hand: no registry, no daemon. Deterministic (fixed mtimes/owners).

  mkimage.py OUT.tar IMAGE_NAME ROOTFS_DIR [--entrypoint A,B] [--cmd A,B] [--workdir /]
             [--user UID:GID]
"""
import argparse, hashlib, io, json, os, tarfile

ap = argparse.ArgumentParser()
ap.add_argument("out"); ap.add_argument("name"); ap.add_argument("rootfs")
ap.add_argument("--entrypoint"); ap.add_argument("--cmd"); ap.add_argument("--workdir", default="/")
ap.add_argument("--user")
a = ap.parse_args()

def layer_tar(root):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for n in sorted(dirnames) + sorted(filenames):
                full = os.path.join(dirpath, n)
                arc = os.path.relpath(full, root)
                ti = t.gettarinfo(full, arcname=arc)
                ti.uid = ti.gid = 0; ti.uname = ti.gname = "root"; ti.mtime = 0
                if ti.isreg():
                    with open(full, "rb") as f: t.addfile(ti, f)
                else:
                    t.addfile(ti)
    return buf.getvalue()

def blob(data): return "sha256:" + hashlib.sha256(data).hexdigest(), data

layer_digest, layer = blob(layer_tar(a.rootfs))
cfg = {"architecture": "amd64", "os": "linux",
       "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                  "WorkingDir": a.workdir},
       "rootfs": {"type": "layers", "diff_ids": [layer_digest]}, "history": [{"created_by": "mkimage.py"}]}
if a.entrypoint: cfg["config"]["Entrypoint"] = a.entrypoint.split(",")
if a.cmd: cfg["config"]["Cmd"] = a.cmd.split(",")
if a.user: cfg["config"]["User"] = a.user
cfg_digest, cfg_bytes = blob(json.dumps(cfg, sort_keys=True).encode())
manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg_digest, "size": len(cfg_bytes)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": len(layer)}]}
man_digest, man_bytes = blob(json.dumps(manifest, sort_keys=True).encode())
tag = a.name.rsplit(":", 1)[1] if ":" in a.name.rsplit("/", 1)[-1] else "latest"
index = {"schemaVersion": 2, "manifests": [{
    "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": man_digest, "size": len(man_bytes),
    "platform": {"architecture": "amd64", "os": "linux"},
    "annotations": {"io.containerd.image.name": a.name, "org.opencontainers.image.ref.name": tag}}]}

with tarfile.open(a.out, "w") as t:
    def add(name, data):
        ti = tarfile.TarInfo(name); ti.size = len(data); ti.mtime = 0; t.addfile(ti, io.BytesIO(data))
    add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    add("index.json", json.dumps(index, sort_keys=True).encode())
    for d, data in ((layer_digest, layer), (cfg_digest, cfg_bytes), (man_digest, man_bytes)):
        add("blobs/sha256/" + d.split(":")[1], data)
print(a.out, a.name, man_digest)
