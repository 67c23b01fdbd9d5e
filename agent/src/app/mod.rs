//! Applications as components: a directory tree installed as a new
//! generation on the data partition and activated by an atomic switch
//! ([docs/components.md](../../docs/components.md)).
//!
//! `index` checks what a generation may hold; `tree` writes a generation
//! from a checked index without ever following a link; `generation` keeps
//! an application's generations and switches between them; `blobs` and
//! `pack` give the tree writer a file's bytes from a directory or server,
//! or from a single-file bundle. None of them
//! fetches, verifies a signature or makes a state transition: that is the
//! machine's, once the release job carries components.

pub mod blobs;
pub mod generation;
pub mod index;
pub mod pack;
pub mod tree;
