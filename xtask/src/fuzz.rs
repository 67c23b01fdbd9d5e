//! `cargo xtask fuzz`.

use crate::util::Result;

pub fn run(_args: &[String]) -> Result {
    Err("not available yet".into())
}
