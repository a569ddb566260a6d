# Sourced by hack/cluster. write_oci_archive writes a one-layer OCI image-layout tar (the
# format `ctr images import` and `docker load` read) from a folder, reproducibly: the same
# folder gives the same bytes (sorted names, time 0, owner root, no compression).
#   write_oci_archive OUT NAME ROOTFS ENTRYPOINT USER
# NAME is the full reference (host/path:tag); ENTRYPOINT one absolute path inside ROOTFS.

oci_blob() { # layout-dir file -> prints "sha256:<hex> <size>" and moves the file into blobs/
  local hex size
  hex=$(sha256sum "$2")
  hex=${hex%% *}
  size=$(stat -c %s "$2")
  mv "$2" "$1/blobs/sha256/$hex"
  echo "sha256:$hex $size"
}

write_oci_archive() {
  local out=$1 name=$2 rootfs=$3 entrypoint=$4 user=$5
  local work
  work=$(mktemp -d)
  mkdir -p "$work/layout/blobs/sha256"
  local tar_opts=(--sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --mode=u+rwX,go+rX,go-w --format=posix
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime)
  tar "${tar_opts[@]}" -C "$rootfs" -cf "$work/layer.tar" .
  local layer layer_digest layer_size
  layer=$(oci_blob "$work/layout" "$work/layer.tar")
  layer_digest=${layer% *}
  layer_size=${layer#* }
  # The uncompressed layer's digest is also its diff_id.
  printf '{"architecture":"amd64","config":{"Entrypoint":["%s"],"User":"%s","WorkingDir":"/"},"created":"1970-01-01T00:00:00Z","os":"linux","rootfs":{"diff_ids":["%s"],"type":"layers"}}' \
    "$entrypoint" "$user" "$layer_digest" > "$work/config.json"
  local config
  config=$(oci_blob "$work/layout" "$work/config.json")
  printf '{"config":{"digest":"%s","mediaType":"application/vnd.oci.image.config.v1+json","size":%s},"layers":[{"digest":"%s","mediaType":"application/vnd.oci.image.layer.v1.tar","size":%s}],"mediaType":"application/vnd.oci.image.manifest.v1+json","schemaVersion":2}' \
    "${config% *}" "${config#* }" "$layer_digest" "$layer_size" > "$work/manifest.json"
  local manifest
  manifest=$(oci_blob "$work/layout" "$work/manifest.json")
  printf '{"manifests":[{"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"},"digest":"%s","mediaType":"application/vnd.oci.image.manifest.v1+json","platform":{"architecture":"amd64","os":"linux"},"size":%s}],"mediaType":"application/vnd.oci.image.index.v1+json","schemaVersion":2}' \
    "$name" "${name##*:}" "${manifest% *}" "${manifest#* }" > "$work/layout/index.json"
  printf '{"imageLayoutVersion":"1.0.0"}' > "$work/layout/oci-layout"
  tar "${tar_opts[@]}" -C "$work/layout" -cf "$out.tmp" .
  mv "$out.tmp" "$out"
  rm -rf "$work"
}
