//! (empty)
