#!/usr/bin/env bash
# Builds the cro container image without a container engine or registry: a static `cro`
# binary and the FTI component are copied onto an empty base by buildah (daemonless,
# rootless-capable, from Debian), into a private image store under the cache directory.
#
# Usage: deploy/image/build.sh [--release] [--check] [--tag NAME] [--oci-archive FILE]
#   --release      an optimised binary (a separate full build, ~10+ minutes on 2 cores);
#                  default: the dev-profile binary, relinked statically from the objects
#                  `cargo test` already built (about a minute), which is what CI checks.
#   --check        after building, verify the image: entrypoint, user, labels, size, the
#                  component at its path, and the binary running alone in the image's root.
#   --tag NAME     image name (default localhost/cro:<version>).
#   --oci-archive  also write the image to FILE, an OCI archive whose index names the image
#                  (annotations org.opencontainers.image.ref.name = the tag and
#                  io.containerd.image.name = the full name), so that
#                  `ctr -n k8s.io images import FILE` and `podman load -i FILE` create it
#                  under that name; push it with `skopeo copy oci-archive:FILE docker://...`.
# Prints the image id last.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE_ROOT="${CRO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cro}"
STORE="$CACHE_ROOT/image-store"
# The dev binary is large (unoptimised); anything near this means something was added.
MAX_DEV_BYTES=$((120 * 1024 * 1024))
MAX_RELEASE_BYTES=$((60 * 1024 * 1024))

log() { echo "[image] $*" >&2; }

release=0; check=0; tag=""; archive=""
while (($#)); do
  case "$1" in
    --release) release=1 ;;
    --check) check=1 ;;
    --tag) tag="$2"; shift ;;
    --oci-archive) archive="$2"; shift ;;
    *) log "unknown argument $1"; exit 2 ;;
  esac
  shift
done
command -v buildah >/dev/null || { log "buildah is missing (scripts/setup.sh installs it)"; exit 1; }
cd "$ROOT"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
tag="${tag:-localhost/cro:$version}"
bah() { buildah --root "$STORE/root" --runroot "$STORE/run" --storage-driver vfs "$@"; }

ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
t0=$(date +%s)
# glibc >= 2.34 carries its DNS and files resolvers inside libc, so a static binary
# resolves names without any NSS library in the image.
if ((release)); then
  cargo rustc --locked --release -p cro --bin cro -- -C target-feature=+crt-static
  bin="target/release/cro"; max=$MAX_RELEASE_BYTES
else
  cargo rustc --locked -p cro --bin cro -- -C target-feature=+crt-static
  bin="target/debug/cro"; max=$MAX_DEV_BYTES
fi
objcopy --strip-all "$bin" "$ctx/cro"
t1=$(date +%s)
CARGO_TARGET_DIR="$ROOT/target/wasm" cargo build --locked --profile component \
  --target wasm32-wasip2 -p fti-provider -p nec-provider
cp "$ROOT/target/wasm/wasm32-wasip2/component/fti_provider.wasm" "$ctx/"
cp "$ROOT/target/wasm/wasm32-wasip2/component/nec_provider.wasm" "$ctx/"
cp "$ROOT/deploy/image/Containerfile" "$ctx/"
t2=$(date +%s)
bah bud --isolation chroot --quiet --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
  -f "$ctx/Containerfile" -t "$tag" "$ctx" >/dev/null
t3=$(date +%s)
log "binary $((t1 - t0)) s, component $((t2 - t1)) s, image $((t3 - t2)) s"
if [[ -n "$archive" ]]; then
  # `buildah push oci-archive:FILE` leaves the index's manifest unnamed, and containerd's
  # importer then creates no image (and says nothing). So: an OCI layout named by the tag
  # (org.opencontainers.image.ref.name), the full name added for containerd and podman
  # (io.containerd.image.name, which both read first), packed as the archive.
  name="$tag"
  [[ "${name##*/}" == *:* ]] || name="$name:latest"
  layout="$ctx/oci-layout"
  bah push --quiet "$tag" "oci:$layout:${name##*:}"
  python3 - "$layout/index.json" "$name" <<'PY' || { log "cannot name the image in $layout/index.json"; exit 1; }
import json, sys
path, name = sys.argv[1], sys.argv[2]
index = json.load(open(path))
assert len(index["manifests"]) == 1, index
notes = index["manifests"][0].setdefault("annotations", {})
assert notes.get("org.opencontainers.image.ref.name") == name.rsplit(":", 1)[1], index
notes["io.containerd.image.name"] = name
json.dump(index, open(path, "w"), separators=(",", ":"))
PY
  tar --sort=name --owner=0 --group=0 --numeric-owner -C "$layout" -cf "$archive.tmp" oci-layout index.json blobs
  mv "$archive.tmp" "$archive"
  log "wrote $archive ($name)"
fi

if ((check)); then
  fail() { log "CHECK FAILED: $*"; exit 1; }
  field() { bah inspect --type image --format "{{$1}}" "$tag"; }
  label() { field "index .OCIv1.Config.Labels \"org.opencontainers.image.$1\""; }
  [[ "$(field .OCIv1.Config.Entrypoint)" == "[/cro]" ]] || fail "entrypoint: $(field .OCIv1.Config.Entrypoint)"
  [[ "$(field .OCIv1.Config.Cmd)" == "[run]" ]] || fail "cmd: $(field .OCIv1.Config.Cmd)"
  [[ "$(field .OCIv1.Config.User)" == "65532:65532" ]] || fail "user: $(field .OCIv1.Config.User)"
  for l in title source licenses version revision; do
    value="$(label "$l")"
    [[ -n "$value" && "$value" != "<no value>" && "$value" != unknown ]] || fail "label org.opencontainers.image.$l missing"
  done
  [[ "$(label version)" == "$version" ]] || fail "version label $(label version), expected $version"
  mnt_ctr="$(bah from --quiet "$tag")"
  trap 'bah rm "$mnt_ctr" >/dev/null 2>&1 || true; rm -rf "$ctx"' EXIT
  mnt="$(bah mount "$mnt_ctr")"
  files="$(cd "$mnt" && find . -type f | sort | tr '\n' ' ')"
  [[ "$files" == "./cro ./opt/cro/providers/fti_provider.wasm ./opt/cro/providers/nec_provider.wasm " ]] || fail "unexpected files in the image: $files"
  bytes=$(( $(stat -c %s "$mnt/cro") + $(stat -c %s "$mnt/opt/cro/providers/fti_provider.wasm") + $(stat -c %s "$mnt/opt/cro/providers/nec_provider.wasm") ))
  ((bytes < max)) || fail "image content is $bytes bytes (limit $max)"
  # A container runtime gives every container a /dev; a bare chroot has none. Loading a
  # 0.2.0 component instantiates it (describe()), and its WASI context seeds random
  # numbers from the kernel, through /dev/random and /dev/urandom where the static
  # binary's getrandom falls back to them. So the check provides those two devices, as a
  # runtime would.
  devs=(random urandom)
  mkdir -p "$mnt/dev" || fail "cannot make /dev in the image's root for the check"
  for d in "${devs[@]}"; do
    touch "$mnt/dev/$d" && mount --bind "/dev/$d" "$mnt/dev/$d" \
      || fail "cannot provide /dev/$d to the image's root for the check"
  done
  trap 'for d in "${devs[@]}"; do umount "$mnt/dev/$d" 2>/dev/null || true; done; bah rm "$mnt_ctr" >/dev/null 2>&1 || true; rm -rf "$ctx"' EXIT
  # Alone in the image's root (no libc, no /etc), as the non-root user: the binary runs,
  # and the component there is one this binary can load.
  out="$(chroot --userspec=65532:65532 "$mnt" /cro --version)" || fail "/cro --version in the image"
  [[ "$out" == "cro $version" ]] || fail "version: $out"
  chroot --userspec=65532:65532 "$mnt" /cro provider inspect /opt/cro/providers/fti_provider.wasm >/dev/null \
    || fail "the FTI component in the image cannot be loaded by its binary"
  chroot --userspec=65532:65532 "$mnt" /cro provider inspect /opt/cro/providers/nec_provider.wasm >/dev/null \
    || fail "the NEC component in the image cannot be loaded by its binary"
  for d in "${devs[@]}"; do umount "$mnt/dev/$d"; done
  bah umount "$mnt_ctr" >/dev/null
  log "checked: entrypoint /cro run, user 65532, labels, files, $bytes bytes of content"
fi
bah images --quiet --noheading --no-trunc "$tag" | head -n1
