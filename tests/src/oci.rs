//! Container image archives for the container-loader handler's tests: an
//! OCI image layout (the OCI image specification's `oci-layout`,
//! `index.json` and content-addressed `blobs/sha256/`) with one
//! uncompressed layer, packed with tar, as `podman load` and `docker load`
//! take it. The image runs nothing: the tests look at which image a tag
//! names, not at a running container.

use std::path::Path;
use std::process::Command;

/// The archive at `out`: image `reference` (`NAME:TAG`, the index's
/// `org.opencontainers.image.ref.name`) whose one layer holds `files`
/// (path, contents).
pub fn archive(out: &Path, reference: &str, files: &[(&str, &[u8])]) {
    let dir = out.with_extension("layout");
    let _ = std::fs::remove_dir_all(&dir);
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).expect("blobs directory");

    let rootfs = out.with_extension("rootfs");
    let _ = std::fs::remove_dir_all(&rootfs);
    for (path, bytes) in files {
        let p = rootfs.join(path);
        std::fs::create_dir_all(p.parent().expect("a file in a directory")).expect("layer dir");
        std::fs::write(&p, bytes).expect("layer file");
    }
    let layer = out.with_extension("layer.tar");
    tar(&rootfs, &layer, &["."]);
    let layer_bytes = std::fs::read(&layer).expect("layer");
    let layer_digest = put_blob(&blobs, &layer_bytes);

    let config = serde_json::json!({
        "architecture": go_arch(),
        "os": "linux",
        "config": { "Cmd": ["/bin/true"] },
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{layer_digest}")] },
    })
    .to_string();
    let config_digest = put_blob(&blobs, config.as_bytes());
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": format!("sha256:{config_digest}"),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": format!("sha256:{layer_digest}"),
            "size": layer_bytes.len(),
        }],
    })
    .to_string();
    let manifest_digest = put_blob(&blobs, manifest.as_bytes());
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{manifest_digest}"),
            "size": manifest.len(),
            "annotations": { "org.opencontainers.image.ref.name": reference },
        }],
    })
    .to_string();
    std::fs::write(dir.join("index.json"), index).expect("index.json");
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#)
        .expect("oci-layout");
    tar(&dir, out, &["oci-layout", "index.json", "blobs"]);
    for d in [&dir, &rootfs] {
        let _ = std::fs::remove_dir_all(d);
    }
    let _ = std::fs::remove_file(&layer);
}

/// `bytes` stored under its sha256 in `blobs`; the hex digest.
fn put_blob(blobs: &Path, bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(blobs.join(&hex), bytes).expect("blob");
    hex
}

fn tar(dir: &Path, out: &Path, members: &[&str]) {
    let status = Command::new("tar")
        .arg("-cf")
        .arg(out)
        .arg("-C")
        .arg(dir)
        .args(["--owner=0", "--group=0", "--numeric-owner"])
        .args(members)
        .status()
        .expect("starting tar");
    assert!(status.success(), "tar -cf {} failed", out.display());
}

/// The host's architecture as an image config names it.
fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        other => other,
    }
}
