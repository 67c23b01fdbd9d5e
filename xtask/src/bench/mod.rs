//! `cargo xtask bench …`: figures printed side by side with the reference
//! tools, measured in the same run on the same data.

mod common;
mod daemon;
mod delta;
mod encrypt;
mod install;
mod publish;
mod references;
mod size;
mod soak;
mod synthetic;

use crate::util::Result;

pub(crate) use common::release_binaries;

pub fn run(args: &[String]) -> Result {
    let (what, rest) = args
        .split_first()
        .ok_or("usage: cargo xtask bench install|daemon|delta|encrypt|publish|size|soak")?;
    match what.as_str() {
        "install" => install::run(rest),
        "daemon" => daemon::run(rest),
        "delta" => delta::run(rest),
        "encrypt" => encrypt::run(rest),
        "publish" => publish::run(rest),
        "size" => size::run(rest),
        "soak" => soak::run(rest),
        other => Err(format!(
            "unknown benchmark {other:?} (install, daemon, delta, encrypt, publish, size, soak)"
        )),
    }
}
