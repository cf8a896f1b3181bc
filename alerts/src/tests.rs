//! Tests across the crate's modules: the built-in rule pack against a simulated fleet
//! (`fleet`), each rule of the pack against rows written for it (`pack`), and damaged state
//! files set aside when alerting opens (`damaged_state`).

mod damaged_state;
mod fleet;
mod pack;
