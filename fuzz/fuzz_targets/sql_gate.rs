//! The SQL statement gate: any text must be allowed or refused with an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(sql) = std::str::from_utf8(data) {
        let _ = gpuwatch_query::gate::check(sql);
    }
});
