//! Test support for updraft's end-to-end tests: the one place that knows how
//! to make keys, releases, slots, servers and devices, so every test reads as
//! a specification of behaviour rather than a page of setup.
//!
//! Everything here drives updraft through its public contract (the `updraft`
//! and `updraft-publish` binaries, their files and sockets) or, for unit-level
//! interop, through the `updraft` library API. Nothing here mocks updraft.

pub mod activity;
pub mod bin;
pub mod bootenv;
pub mod bundle;
pub mod ca;
pub mod collector;
pub mod ddi_rig;
pub mod ddi_server;
pub mod device;
pub mod faketime;
pub mod goosebit;
pub mod hostile_client;
pub mod http;
pub mod nginx;
pub mod powerfs;
pub mod prereq;
pub mod previous;
pub mod proxied;
pub mod proxy;
pub mod publisher;
pub mod rng;
pub mod server;
pub mod skip;
pub mod static_server;
pub mod tmp;

/// The workspace root: the repository checkout the tests run from (for
/// the unit file, the Yocto layer and the boot scripts it ships).
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}
