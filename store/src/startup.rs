//! Why the server is not ready yet, in words: `/readyz`, the 503 answers of writes and queries
//! and the Postgres error of a server whose store is not open say what is really going on
//! (opening the tables, replaying the write-ahead log, or an error it retries) instead of a
//! fixed text.
//!
//! One process opens one store, so this is kept per process: [`Store::open`](crate::Store::open)
//! and the server's open loop set it, the front ends read it until the store is open.

use std::sync::Mutex;

static PHASE: Mutex<Option<String>> = Mutex::new(None);

/// Says what the store is doing now (or why it cannot open).
pub fn set(phase: impl Into<String>) {
    *PHASE.lock().unwrap_or_else(|e| e.into_inner()) = Some(phase.into());
}

/// What the store is doing now, for a not-ready answer.
pub fn reason() -> String {
    PHASE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .unwrap_or_else(|| "the store is opening: retry shortly".into())
}
