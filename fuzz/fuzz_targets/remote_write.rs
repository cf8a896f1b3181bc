//! Prometheus remote-write bodies: the input as a snappy-compressed body (the HTTP path), and
//! the same bytes as an already decompressed `WriteRequest` protobuf (so the fuzzer reaches the
//! protobuf decoder without having to learn snappy's framing).
#![no_main]

use gpuwatch_store::ingest::remote_write::{decode_protobuf, decode_request, to_write_batch};
use libfuzzer_sys::fuzz_target;

/// The server clock the decoder compares times with (2027-01-15).
const NOW: i64 = 1_800_000_000_000_000_000;

fuzz_target!(|data: &[u8]| {
    let _ = decode_request(
        Some("application/x-protobuf"),
        Some("snappy"),
        data,
        16 << 20,
        NOW,
    );
    if let Ok(req) = decode_protobuf(data) {
        let _ = to_write_batch(&req, NOW);
    }
});
