//! Tests across the crate's modules: the built-in rule pack against a simulated fleet
//! (`fleet`), and each rule of the pack against rows written for it (`pack`).

mod fleet;
mod pack;
