//! updraft: an over-the-air A/B update agent for Linux edge devices.
//!
//! The library holds everything the device binary does, and the parts the
//! publisher shares with it (manifest schema, envelopes, trust). See
//! `docs/architecture.md` for the map of modules and how an update flows
//! through them.

pub mod error;

pub mod artifact;
pub mod bootloader;
pub mod clock;
pub mod config;
pub mod delta;
pub mod envelope;
pub mod fsutil;
pub mod hash;
// pub mod install;
pub mod manifest;
pub mod slot;
pub mod state;
pub mod store;
pub mod timestamp;
pub mod trust;

pub use error::{Error, Kind, Result};
