#!/usr/bin/env bash
# Builds the images the real-node test tier runs, without a registry or a container
# engine: the stand-ins for the GPU node software (`cro.local/node-standin:dev`: one static
# multi-call binary installed as sh, nvidia-smi, chroot, modinfo, ... plus the device
# plugin) and the pod sandbox image (`cro.local/pause:dev`). Each is written as an OCI
# image-layout archive whose index names the image, so `ctr -n k8s.io images import FILE`
# creates it. Archives are cached outside the repository, keyed by the digest of what went
# in, so a second run with the same binaries only re-hashes them.
#
# Prints two lines at the end: the node-standin archive, then the pause archive.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
CACHE_ROOT="${CRO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cro}"
OUT="$CACHE_ROOT/real-node/images"
log() { echo "[real-node images] $*" >&2; }

# The stand-in binary: static (musl) so the image needs no libc.
TARGET=x86_64-unknown-linux-musl
if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx "$TARGET"; then
  log "adding the $TARGET target"
  rustup target add "$TARGET" >&2
fi
log "building node-standin for $TARGET"
(cd "$ROOT" && CARGO_TARGET_DIR="$ROOT/target/standin" cargo build --locked --release \
  -p node-standin --target "$TARGET" >&2)
STANDIN="$ROOT/target/standin/$TARGET/release/node-standin"
PLUGIN="$("$ROOT/tests/real-node/device-plugin/build.sh" | tail -n 1)"
[[ -x "$STANDIN" && -x "$PLUGIN" ]] || { log "missing $STANDIN or $PLUGIN"; exit 1; }

mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9

# write_image NAME ROOTFS ENTRYPOINT_JSON -> prints the archive path
write_image() {
  local name=$1 rootfs=$2 entry=$3 work layer layer_digest config config_digest manifest manifest_digest
  work="$(mktemp -d "$OUT/.build.XXXXXX")"
  mkdir -p "$work/blobs/sha256"
  # Reproducible: same files, same digest (names sorted, owners and times fixed).
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$rootfs" -cf "$work/layer.tar" .
  layer_digest=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
  mv "$work/layer.tar" "$work/blobs/sha256/$layer_digest"
  config=$(printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":%s,"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' "$entry" "$layer_digest")
  printf '%s' "$config" > "$work/config.json"
  config_digest=$(sha256sum "$work/config.json" | cut -d' ' -f1)
  mv "$work/config.json" "$work/blobs/sha256/$config_digest"
  manifest=$(printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%d},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%d}]}' \
    "$config_digest" "${#config}" "$layer_digest" "$(stat -c %s "$work/blobs/sha256/$layer_digest")")
  printf '%s' "$manifest" > "$work/manifest.json"
  manifest_digest=$(sha256sum "$work/manifest.json" | cut -d' ' -f1)
  mv "$work/manifest.json" "$work/blobs/sha256/$manifest_digest"
  # containerd names the imported image after io.containerd.image.name; other tools
  # read the OCI ref.name. Without either, `ctr images import` exits 0 and creates nothing.
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%d,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"},"platform":{"architecture":"amd64","os":"linux"}}]}' \
    "$manifest_digest" "${#manifest}" "$name" "$name" > "$work/index.json"
  printf '{"imageLayoutVersion":"1.0.0"}' > "$work/oci-layout"
  local prefix file
  prefix="$OUT/$(echo "$name" | tr '/:' '__')"
  file="$prefix-$manifest_digest.tar"
  if [[ ! -f "$file" ]]; then
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work" -cf "$file.tmp" oci-layout index.json blobs
    mv "$file.tmp" "$file"
  fi
  # Archives of earlier builds of the same image are never used again.
  find "$OUT" -maxdepth 1 -name "$(basename "$prefix")-*.tar" ! -path "$file" -delete
  rm -rf "$work"
  echo "$file"
}

rootfs="$(mktemp -d "$OUT/.rootfs.XXXXXX")"
trap 'rm -rf "$rootfs"' EXIT
mkdir -p "$rootfs"/{bin,sbin,usr/bin,usr/sbin,tmp,proc,sys,dev,etc,run,host-root}
chmod 1777 "$rootfs/tmp"
cp "$STANDIN" "$rootfs/node-standin"
cp "$PLUGIN" "$rootfs/cro-standin-device-plugin"
# Every command the operator runs on a node is this one binary; it forwards the command to
# the test's stand-in service (or, as `pause`/`ready`, runs the pod itself).
for tool in bin/sh usr/bin/nvidia-smi usr/sbin/chroot usr/bin/chroot sbin/modinfo sbin/lsmod \
            sbin/modprobe sbin/rmmod usr/bin/pkill; do
  ln -s /node-standin "$rootfs/$tool"
done
standin_archive=$(write_image cro.local/node-standin:dev "$rootfs" '["/node-standin","pause"]')

pause="$(mktemp -d "$OUT/.rootfs.XXXXXX")"
trap 'rm -rf "$rootfs" "$pause"' EXIT
mkdir -p "$pause"/{proc,sys,dev,etc,tmp}
cp "$STANDIN" "$pause/pause"
pause_archive=$(write_image cro.local/pause:dev "$pause" '["/pause"]')
log "images ready"
echo "$standin_archive"
echo "$pause_archive"
