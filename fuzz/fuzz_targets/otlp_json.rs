//! OTLP/HTTP JSON bodies: decode, turn into table rows, and round-trip through the WAL
//! record encoding. Any input must give rows or an error, never a panic.
#![no_main]

use gpuwatch_store::ingest::http::decode_request;
use gpuwatch_store::wal::record::{decode_payload, encode_payload};
use libfuzzer_sys::fuzz_target;

/// The server clock the decoder compares times with (2027-01-15).
const NOW: i64 = 1_800_000_000_000_000_000;

fuzz_target!(|data: &[u8]| {
    if let Ok((batch, _, _)) = decode_request(
        Some("application/json"),
        None,
        data,
        16 << 20,
        NOW,
    ) {
        let payload = encode_payload(&batch).expect("a decoded batch encodes");
        let back = decode_payload(&payload).expect("an encoded batch decodes");
        assert_eq!(back.rows(), batch.rows());
    }
});
