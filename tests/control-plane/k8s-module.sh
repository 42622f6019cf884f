# Sourced by ensure-binaries.sh and ensure-node-binaries.sh: the Go module both build
# Kubernetes commands in. k8s.io/kubernetes points every staging module at ./staging/...;
# outside its own tree those must be pinned to the published v0.X.Y of the same release.
# The list comes from the module's own go.mod, so it follows the version without hand edits.
#
# k8s_module NAME: writes go.mod (module NAME) requiring k8s.io/kubernetes@$K8S_VERSION in
# the current directory. Needs K8S_VERSION and a `log` function.
k8s_module() {
  local name=$1 staging="v0.${K8S_VERSION#v1.}" kmod
  printf 'module %s\n\ngo 1.26.0\n' "$name" > go.mod
  GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$K8S_VERSION" > download.json
  kmod=$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p' download.json)
  [[ -f "$kmod" ]] || { log "could not find the go.mod of k8s.io/kubernetes@$K8S_VERSION"; return 1; }
  {
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo "replace ("
    grep -E '^[[:space:]]*k8s\.io/[^ ]+ => \./staging/' "$kmod" \
      | awk -v v="$staging" '{print "\t" $1 " => " $1 " " v}'
    echo ")"
  } >> go.mod
}
