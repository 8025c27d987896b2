#!/usr/bin/env bash
# Builds the Docker sandbox image locally, with no registry and no network:
#
#   bash scripts/docker_image.sh [PYTHON]        # PYTHON: the venv's, .venv/bin/python by default
#
# Image = a root filesystem holding the venv's own interpreter (its base install, as
# /usr/local/bin/python), its standard library (no tests, idle/tk, build config or -O .pyc), the
# site-packages of only numpy, pandas, scikit-learn and scipy and what they require (the venv's
# versions, copied file by file from their RECORDs, without their tests/ suites), the system
# shared libraries all of these link against (found with ldd, copied under their sonames) and
# an /etc/ld.so.cache. It is imported with `docker import` as rl4mle-sandbox:<recipe> and tagged
# rl4mle-sandbox:local (the default image of Sandbox(backend="docker")). <recipe> hashes this
# script, the interpreter's version and every copied distribution's name and version: an
# unchanged recipe is not rebuilt (images of earlier recipes are removed).
set -euo pipefail
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$SELF")/.."
PY=${1:-.venv/bin/python}
NAME=rl4mle-sandbox
ALIAS=${RL4MLE_DOCKER_IMAGE:-$NAME:local}
PACKAGES="numpy pandas scikit-learn scipy"

[ -x "$PY" ] || { echo "docker_image: no interpreter at $PY (run \`make setup\` first)" >&2; exit 2; }
docker info >/dev/null 2>&1 || { echo "docker_image: no Docker engine answers (bash scripts/docker_engine.sh start)" >&2; exit 2; }

# The list of files to copy: "src<TAB>dest" lines, dests relative to the root filesystem. The
# first line is "#recipe <hash input>".
plan=$(mktemp)
trap 'rm -f "$plan"' EXIT
"$PY" - "$PACKAGES" "$SELF" >"$plan" <<'EOF'
import glob, hashlib, importlib.metadata as md, os, re, subprocess, sys, sysconfig
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement

base = sys.base_prefix
ver = f"python{sys.version_info[0]}.{sys.version_info[1]}"
stdlib = os.path.join(base, "lib", ver)
site = sysconfig.get_paths()["purelib"]
out = []  # (src, dest)

def norm(n):
    return re.sub(r"[-_.]+", "-", n).lower()

# 1. the interpreter and its standard library
exe = os.path.realpath(os.path.join(base, "bin", ver))
out.append((exe, f"usr/local/bin/{ver}"))
for lib in glob.glob(os.path.join(base, "lib", "libpython*.so*")):
    if not os.path.islink(lib):  # the real file, under its soname (the links: copies)
        out.append((lib, "usr/local/lib/" + os.path.basename(lib)))
SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "site-packages", "lib2to3",
        "pydoc_data"}
for dirpath, dirs, files in os.walk(stdlib):
    rel = os.path.relpath(dirpath, stdlib)
    if rel == ".":
        dirs[:] = [d for d in dirs if d not in SKIP and not d.startswith("config-")]
    dirs[:] = [d for d in dirs if d not in ("tests", "idle_test")]
    for f in files:
        if f.endswith((".opt-1.pyc", ".opt-2.pyc")):
            continue  # only for python -O
        out.append((os.path.join(dirpath, f), os.path.normpath(f"usr/local/lib/{ver}/{rel}/{f}")))

# 2. the packages the prompts offer, and what they require, at the venv's versions
dists, todo = {}, sys.argv[1].split()
while todo:
    n = todo.pop()
    if norm(n) in dists:
        continue
    d = md.distribution(n)
    dists[norm(n)] = d
    for r in d.requires or []:
        req = Requirement(r)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            todo.append(req.name)
for key in sorted(dists):
    for f in dists[key].files or []:
        src = os.path.normpath(os.path.join(site, str(f)))
        if not src.startswith(site + os.sep) or not os.path.isfile(src):
            continue  # console scripts (../../bin) and files the RECORD lists but pip dropped
        if "tests" in os.path.relpath(src, site).split(os.sep):
            continue  # the packages' own test suites (a third of their size), never imported
        out.append((src, f"usr/local/lib/{ver}/site-packages/" + os.path.relpath(src, site)))

# 3. the shared libraries all ELF files link against (system ones; the rest are copied above)
libs = {}
for src, _ in out:
    if not (src.endswith(".so") or ".so." in src or src == exe):
        continue
    r = subprocess.run(["ldd", src], capture_output=True, text=True)
    for line in r.stdout.splitlines():
        m = re.search(r"(/\S+) \(0x", line)
        if m is None:
            continue
        p = m.group(1)
        if p.startswith((base + "/", site + "/", os.path.realpath(site) + "/")):
            continue
        # under its soname, in the real directory (merged /usr: /lib -> usr/lib)
        libs[p] = os.path.realpath(os.path.dirname(p)).lstrip("/") + "/" + os.path.basename(p)
out += sorted(libs.items())
for f in sorted(glob.glob("/usr/lib/locale/C.utf8/**", recursive=True)):  # LANG=C.UTF-8
    if os.path.isfile(f):
        out.append((f, f.lstrip("/")))

recipe = [hashlib.sha256(open(sys.argv[2], "rb").read()).hexdigest(), sys.version,
          os.uname().machine,
          *(f"{k}=={d.version}" for k, d in sorted(dists.items())),
          *(f"{os.path.basename(p)}" for p in sorted(libs))]
print("#recipe " + hashlib.sha256("\n".join(recipe).encode()).hexdigest()[:16]
      + " " + " ".join(f"{k}=={d.version}" for k, d in sorted(dists.items())))
for src, dest in out:
    print(f"{src}\t{dest}")
EOF

read -r _ RECIPE VERSIONS < <(head -1 "$plan")
IMAGE=$NAME:$RECIPE
if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  docker tag "$IMAGE" "$ALIAS"
  echo "docker_image: $IMAGE exists (recipe unchanged), tagged $ALIAS"
  exit 0
fi

echo "docker_image: building $IMAGE ($VERSIONS)"
t0=$(date +%s)
root=$(mktemp -d "${TMPDIR:-/tmp}/rl4mle-rootfs.XXXXXX")
trap 'rm -f "$plan"; rm -rf "$root"' EXIT
mkdir -p "$root"/usr/{bin,sbin,lib,lib64,local/bin,local/lib} "$root"/{etc,tmp,workdir,proc,sys,dev}
for d in bin sbin lib lib64; do ln -s "usr/$d" "$root/$d"; done
"$PY" - "$plan" "$root" <<'PYEOF'
import os, shutil, sys
root = sys.argv[2]
for line in open(sys.argv[1]).read().splitlines()[1:]:
    src, dest = line.split("\t")
    os.makedirs(os.path.join(root, os.path.dirname(dest)), exist_ok=True)
    shutil.copy2(src, os.path.join(root, dest))  # contents, mode and mtime (.pyc stay valid)
PYEOF
ver=$(cd "$root/usr/local/bin" && ls python3.*)
ln -s "$ver" "$root/usr/local/bin/python3"
ln -s "$ver" "$root/usr/local/bin/python"
ln -s ../local/bin/python3 "$root/usr/bin/python3"
ln -s ../local/bin/python3 "$root/usr/bin/python"
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:1000:1000:sandbox:/tmp:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n' >"$root/etc/group"
printf '/usr/local/lib\n/usr/lib/%s-linux-gnu\n' "$(uname -m)" >"$root/etc/ld.so.conf"
ldconfig -r "$root"
chmod 1777 "$root/tmp"
chmod -R a+rX,go-w "$root/usr" "$root/etc"
# A check before the import: the interpreter starts from the new root and imports every package.
if command -v chroot >/dev/null && [ "$(id -u)" = 0 ]; then
  chroot "$root" /usr/local/bin/python -I -W ignore -c "import numpy, pandas, scipy, sklearn, socket, ctypes" \
    || { echo "docker_image: the root filesystem's python cannot import its packages" >&2; exit 1; }
fi
size=$(du -sm "$root" | cut -f1)
tar --sort=name --numeric-owner --owner=0 --group=0 -C "$root" -c . \
  | docker import -c 'ENV PATH=/usr/local/bin:/usr/bin:/bin' -c 'CMD ["/usr/local/bin/python"]' \
      -c 'WORKDIR /workdir' -m "rl4mle sandbox: $VERSIONS" - "$IMAGE" >/dev/null
docker tag "$IMAGE" "$ALIAS"
for old in $(docker images "$NAME" --format '{{.Tag}}'); do  # images of earlier recipes
  case $old in "$RECIPE"|"${ALIAS#*:}") ;; *) docker rmi "$NAME:$old" >/dev/null 2>&1 || true ;; esac
done
docker run --rm --network none "$IMAGE" python -I -c "import numpy, pandas, scipy, sklearn" \
  || { echo "docker_image: the image's python cannot import its packages" >&2; exit 1; }
mb=$(( $(docker image inspect -f '{{.Size}}' "$IMAGE") >> 20 ))
echo "docker_image: built $IMAGE (${size} MB root filesystem, image ${mb} MB) in $(( $(date +%s) - t0 )) s, tagged $ALIAS"
