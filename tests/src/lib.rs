//! Test support for updraft's end-to-end tests: the one place that knows how
//! to make keys, releases, slots, servers and devices, so every test reads as
//! a specification of behaviour rather than a page of setup.
//!
//! Everything here drives updraft through its public contract (the `updraft`
//! and `updraft-publish` binaries, their files and sockets) or, for unit-level
//! interop, through the `updraft` library API. Nothing here mocks updraft.

pub mod activity;
pub mod apps;
pub mod bin;
pub mod bootenv;
pub mod bundle;
pub mod ca;
pub mod collector;
pub mod ddi_rig;
pub mod ddi_server;
pub mod device;
pub mod faketime;
pub mod fat;
pub mod goosebit;
pub mod hostile_client;
pub mod http;
pub mod nginx;
pub mod oci;
pub mod outage;
pub mod powerfs;
pub mod prereq;
pub mod previous;
pub mod proxied;
pub mod proxy;
pub mod publisher;
pub mod rng;
pub mod rpi;
pub mod server;
pub mod skip;
pub mod static_server;
pub mod swtpm;
pub mod tmp;
pub mod updaters;

/// `cargo`, as the user invokes it (respects `CARGO`), without the
/// variables cargo sets for a package it runs (`CARGO_MANIFEST_DIR`,
/// `CARGO_PKG_*`, ...).
///
/// A test or `cargo xtask` is run by cargo and has them. A nested cargo
/// that inherits them sees their values as changed since the last build run
/// from a shell (or from another such process) and rebuilds the crates
/// whose build scripts track them (ring, and everything above it).
pub fn cargo_command() -> std::process::Command {
    let mut c = std::process::Command::new(
        std::env::var_os("CARGO")
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| "cargo".into()),
    );
    for (k, _) in std::env::vars_os() {
        if let Some(k) = k.to_str() {
            if k.starts_with("CARGO_PKG_")
                || matches!(
                    k,
                    "CARGO_MANIFEST_DIR"
                        | "CARGO_MANIFEST_PATH"
                        | "CARGO_MANIFEST_LINKS"
                        | "CARGO_CRATE_NAME"
                        | "CARGO_BIN_NAME"
                        | "CARGO_PRIMARY_PACKAGE"
                        | "CARGO_TARGET_TMPDIR"
                        | "OUT_DIR"
                )
            {
                c.env_remove(k);
            }
        }
    }
    c
}

/// The workspace root: the repository checkout the tests run from (for
/// the unit file, the Yocto layer and the boot scripts it ships).
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// A finished command's stdout and stderr as one text, after it succeeded
/// (`what` names it in the failure).
pub fn succeeded(out: &std::process::Output, what: &str) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{text}",
        out.status
    );
    text
}
