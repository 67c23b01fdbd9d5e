//! Trees as components: an application's directory tree installed as a
//! new generation on the data partition and activated by an atomic
//! switch, and a slot's boot files written into that slot's boot
//! directory ([docs/components.md](../../docs/components.md)).
//!
//! `index` checks what a tree may hold; `tree` writes one from a checked
//! index without ever following a link; `generation` keeps an
//! application's generations and switches between them; `boot` writes the
//! boot files of the slot being installed; `blobs` and
//! `pack` give the tree writer a file's bytes from a directory or server,
//! or from a single-file bundle. None of them
//! fetches, verifies a signature or makes a state transition: that is the
//! machine's, once the release job carries components.

pub mod blobs;
pub mod boot;
pub mod generation;
pub mod index;
pub mod pack;
pub mod tree;
