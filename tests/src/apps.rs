//! Applications as components of a release: trees on the build host, a
//! device configured for an app, and what the device holds of it.

use std::path::{Path, PathBuf};

use crate::device::{Device, DeviceSpec};
use crate::proxied::ProxiedServer;
use crate::publisher::KeyPair;

/// Write an app tree at `dir` (replacing what was there): `files` as
/// (relative path, content); directories are made as needed.
pub fn write_tree(dir: &Path, files: &[(&str, &str)]) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("creating an app tree");
    for (path, content) in files {
        let full = dir.join(path);
        if let Some(parent) = full.parent() {
            std::fs::create_dir_all(parent).expect("creating an app directory");
        }
        std::fs::write(&full, content).expect("writing an app file");
    }
}

/// The configuration of app `name` on a device whose files are below
/// `dev_dir`: `[apps] dir` there, the app's health checks in
/// `<dev_dir>/health-<name>.d`, `extra` lines added to its table.
pub fn app_sections(dev_dir: &Path, name: &str, extra: &str) -> String {
    format!(
        "[apps]\ndir = {:?}\n\n[components.{name}]\nkind = \"app\"\nhealth_dir = {:?}\n{extra}\n",
        apps_dir(dev_dir),
        health_dir(dev_dir, name)
    )
}

pub fn apps_dir(dev_dir: &Path) -> PathBuf {
    dev_dir.join("apps")
}

pub fn health_dir(dev_dir: &Path, name: &str) -> PathBuf {
    dev_dir.join(format!("health-{name}.d"))
}

/// A device polling `ps` every second, booted from slot A that its release
/// marker says holds `release`, configured for app `name`.
pub fn app_device(ps: &ProxiedServer, dev_name: &str, release: &str, name: &str) -> Device {
    app_device_polling(ps, dev_name, release, name, "1s")
}

/// [`app_device`], polling every `poll`.
pub fn app_device_polling(
    ps: &ProxiedServer,
    dev_name: &str,
    release: &str,
    name: &str,
    poll: &str,
) -> Device {
    let spec: DeviceSpec = ps.device_spec(poll, "");
    let mut dev = Device::new(dev_name, spec);
    let marker = dev.path("etc-updraft-release");
    std::fs::write(&marker, format!("UPDRAFT_RELEASE={release}\n")).expect("release marker");
    let dir = dev.dir().to_path_buf();
    std::fs::create_dir_all(health_dir(&dir, name)).expect("health dir");
    dev.reconfigure(|s| {
        s.device = format!("release_file = {:?}", marker.display().to_string());
        s.sections = app_sections(&dir, name, "");
    });
    dev.init();
    dev
}

/// The generation `current` names for app `name` (`None`: none active).
pub fn active_generation(dev: &Device, name: &str) -> Option<u64> {
    active_generation_at(&apps_dir(dev.dir()).join(name))
}

/// The generation `current` names in the app directory `app`.
pub fn active_generation_at(app: &Path) -> Option<u64> {
    let target = std::fs::read_link(app.join("current")).ok()?;
    target.strip_prefix("gen").ok()?.to_str()?.parse().ok()
}

/// The generations present for app `name`, oldest first.
pub fn generations(dev: &Device, name: &str) -> Vec<u64> {
    let dir = apps_dir(dev.dir()).join(name).join("gen");
    let mut out: Vec<u64> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    out.sort_unstable();
    out
}

/// What the active generation of app `name` holds at `path`.
pub fn active_file(dev: &Device, name: &str, path: &str) -> Option<String> {
    std::fs::read_to_string(apps_dir(dev.dir()).join(name).join("current").join(path)).ok()
}

/// Publish release `version` of apps only (`apps`: `NAME[@VERSION]=DIR`)
/// into `ps`'s site: the slot of the release already there is kept.
pub fn publish_apps(ps: &ProxiedServer, version: &str, apps: &[String]) -> String {
    let flags: Vec<String> = apps
        .iter()
        .flat_map(|a| ["--app".to_string(), a.clone()])
        .collect();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    publish_components(ps, version, &flags)
}

/// Publish release `version` with the component flags `flags`
/// (`--app`, `--command`) into `ps`'s site, keeping its slot.
pub fn publish_components(ps: &ProxiedServer, version: &str, flags: &[&str]) -> String {
    publish_into(&ps.key, &ps.server.repo.dir, version, flags)
}

/// `updraft-publish release` of `version` signed by `key` into `site`
/// (compatible with the test board, fast compression), with `flags`
/// (`--app`, `--command`, `--image`).
pub fn publish_into(key: &KeyPair, site: &Path, version: &str, flags: &[&str]) -> String {
    let key = key.key.to_str().expect("utf-8 path").to_string();
    let out = site.to_str().expect("utf-8 path").to_string();
    let mut args: Vec<&str> = vec![
        "release",
        "--key",
        &key,
        "--version",
        version,
        "--compatible",
        "testboard",
        "--level",
        "3",
        "--out",
        &out,
    ];
    args.extend_from_slice(flags);
    crate::publisher::publish_ok(&args)
}

/// A history entry's detail, with the number before ` ms` after `after`
/// (`committed in 41 ms`).
pub fn millis_after(detail: &str, after: &str) -> u64 {
    let rest = detail
        .split_once(after)
        .unwrap_or_else(|| panic!("{after:?} not in {detail:?}"))
        .1;
    rest.trim_start()
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after {after:?} in {detail:?}"))
}

/// The app's health check: the active generation holds a file `healthy`.
pub fn health_needs_healthy_file(dev: &Device, name: &str) {
    crate::tmp::write_executable(
        &health_dir(dev.dir(), name).join("10-healthy"),
        "#!/bin/sh\nexec test -f \"$UPDRAFT_APP_DIR/current/healthy\"\n",
    );
}
