//! updraft-publish: the build-host side of updraft (keys, signed manifests,
//! artifacts and deltas).

pub mod delta;
