//! updraft: an over-the-air A/B update agent for Linux edge devices.
//!
//! The library holds everything the device binary does, and the parts the
//! publisher shares with it (manifest schema, envelopes, trust). See
//! `docs/architecture.md` for the map of modules and how an update flows
//! through them.

pub mod error;

pub mod artifact;
pub mod backoff;
pub mod bootloader;
mod child;
pub mod cli;
pub mod clock;
pub mod config;
pub mod control;
pub mod daemon;
pub mod delta;
pub mod envelope;
pub mod fetch;
pub mod fsutil;
pub mod hash;
pub mod health;
pub mod identity;
pub mod install;
pub mod lock;
pub mod logging;
pub mod machine;
pub mod manifest;
pub mod metrics;
pub mod notify;
mod poll;
pub mod progress;
mod reconcile;
pub mod report;
pub mod rollout;
pub mod slot;
pub mod source;
pub mod state;
pub mod status;
pub mod store;
pub mod timestamp;
pub mod toml_subset;
pub mod trust;
pub mod worker;

#[cfg(test)]
mod test_support;

pub use error::{Error, Kind, Result};
