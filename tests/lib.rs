//! Support crate for the end-to-end tests in `e2e/`.
