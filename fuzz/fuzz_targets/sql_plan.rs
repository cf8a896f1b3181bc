//! Arbitrary SQL through the gate, the planner and execution, with tiny limits: every statement
//! is answered or refused with an error within its time limit, never a panic, an abort (stack
//! overflow, out of memory) or a hang.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use gpuwatch_query::{EngineConfig, QueryEngine};
use gpuwatch_store::schema::Table;
use gpuwatch_store::{ReadStore, TableSnapshot};
use libfuzzer_sys::fuzz_target;

/// A store with no rows: what is fuzzed is the SQL, not the data.
#[derive(Debug)]
struct NoRows;

impl ReadStore for NoRows {
    fn snapshot(&self, _: Table) -> TableSnapshot {
        TableSnapshot {
            batches: Vec::new(),
            files: Vec::new(),
            warnings: Vec::new(),
        }
    }
}

fn engine() -> &'static (tokio::runtime::Runtime, QueryEngine) {
    static ENGINE: OnceLock<(tokio::runtime::Runtime, QueryEngine)> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let engine = runtime.block_on(async {
            QueryEngine::new(
                Arc::new(NoRows),
                EngineConfig {
                    query_timeout: Duration::from_millis(200),
                    memory_limit: Some(4 << 20),
                    max_value_bytes: 64 << 10,
                    max_answer_bytes: Some(1 << 20),
                    ..EngineConfig::default()
                },
            )
            .expect("engine")
        });
        (runtime, engine)
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(sql) = std::str::from_utf8(data) else {
        return;
    };
    let (runtime, engine) = engine();
    let _ = runtime.block_on(engine.query(sql));
});
