//! updraft-publish: the build-host side of updraft.
//!
//! Makes keys, key documents, content-addressed artifacts, deltas and signed
//! manifests into a directory that any web server, object store or CDN can
//! serve as it is. Everything the device also needs to understand (the
//! manifest schema, envelopes, trust rules) comes from the `updraft` crate,
//! so the two sides cannot drift apart. Nothing here is ever linked into the
//! device binary.

pub mod app;
pub mod attest;
pub mod bundle;
pub mod delta;
pub mod description;
pub mod keys;
pub mod modules;
pub mod release;
pub mod reports;
pub mod sign;
pub mod verify;
