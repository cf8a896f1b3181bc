//! Cost.
