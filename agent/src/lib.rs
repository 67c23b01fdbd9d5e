//! updraft: an over-the-air A/B update agent for Linux edge devices.
//!
//! The library holds everything the device binary does, and the parts the
//! publisher shares with it (manifest schema, envelopes, trust). See
//! `docs/architecture.md` for the map of modules and how an update flows
//! through them.

pub mod error;

pub mod adopt;
pub mod app;
pub mod artifact;
mod backoff;
pub mod bootloader;
pub mod bundle;
mod channel;
mod child;
pub mod cli;
mod clock;
pub mod config;
mod control;
mod daemon;
pub mod ddi;
pub mod delta;
pub mod device_key;
pub mod direct_io;
pub mod encrypt;
pub mod envelope;
pub mod events;
mod fetch;
mod fsutil;
pub mod handler;
pub mod hash;
mod hawkbit;
mod health;
pub mod help;
mod identity;
pub mod inhibit;
mod install;
pub mod journal;
pub mod keys;
mod lock;
pub mod logging;
mod machine;
pub mod manifest;
mod memory;
pub mod metrics;
mod notify;
mod pipeline;
mod poll;
mod progress;
pub mod protect;
pub mod provision;
mod random;
mod readback;
mod reconcile;
mod report;
pub mod rollback_counter;
pub mod rollout;
mod signals;
pub mod signed_report;
pub mod slot;
mod source;
mod state;
mod status;
mod store;
mod throttle;
pub mod timestamp;
pub mod toml_subset;
pub mod trust;
pub mod window;
mod worker;

#[cfg(test)]
mod test_support;

pub use error::{Error, Kind, Result};
