//! A `prometheus.WriteRequest` decoded without copying its strings.
//!
//! The generated [`super::proto`] types give every label name and value its own `String` and
//! every series its own vectors: thousands of allocations per request. [`WriteRequestView`]
//! instead borrows each label from the decompressed body (checked to be UTF-8) and keeps the
//! labels and samples of all series in two flat vectors, so a request costs a handful of
//! allocations whatever its size.
//!
//! It reads the same wire format as prost does for these messages: fields in any order, a
//! repeated occurrence of a scalar field replaces the earlier one, unknown fields (metadata,
//! exemplars, native histograms, anything newer) are skipped by their wire type. A truncated or
//! otherwise malformed message, a label that is not UTF-8 or a field with the wrong wire type is
//! an error that names what was wrong and where.

use std::ops::Range;

use super::proto::WriteRequest;
use crate::{Error, Result};

/// One sample: the value and its time in milliseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleView {
    /// The value.
    pub value: f64,
    /// Milliseconds since the Unix epoch.
    pub timestamp: i64,
}

/// One series: ranges into the request's flat label and sample vectors.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SeriesRanges {
    labels: Range<usize>,
    samples: Range<usize>,
}

/// A decoded `WriteRequest` whose label names and values borrow from the protobuf bytes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WriteRequestView<'a> {
    series: Vec<SeriesRanges>,
    labels: Vec<(&'a str, &'a str)>,
    samples: Vec<SampleView>,
}

/// One series of a [`WriteRequestView`].
#[derive(Debug, Clone, Copy)]
pub struct SeriesView<'r, 'a> {
    /// Labels (name, value) in the order they were sent.
    pub labels: &'r [(&'a str, &'a str)],
    /// Samples in the order they were sent.
    pub samples: &'r [SampleView],
}

impl<'a> WriteRequestView<'a> {
    /// Decodes a (decompressed) protobuf `WriteRequest`.
    pub fn decode(raw: &'a [u8]) -> Result<Self> {
        let mut view = WriteRequestView::default();
        let mut r = Reader::new(raw);
        while let Some((field, wire)) = r.key()? {
            if field == 1 {
                expect_len(wire, "WriteRequest.timeseries")?;
                let body = r.bytes()?;
                let index = view.series.len();
                view.decode_series(body).map_err(|e| {
                    Error::malformed("remote write protobuf", format!("timeseries {index}: {e}"))
                })?;
            } else {
                r.skip(field, wire)?;
            }
        }
        Ok(view)
    }

    /// A view of an already decoded request (its strings borrowed).
    pub fn from_request(req: &'a WriteRequest) -> Self {
        let mut view = WriteRequestView::default();
        for ts in &req.timeseries {
            let l0 = view.labels.len();
            let s0 = view.samples.len();
            view.labels.extend(
                ts.labels
                    .iter()
                    .map(|l| (l.name.as_str(), l.value.as_str())),
            );
            view.samples.extend(ts.samples.iter().map(|s| SampleView {
                value: s.value,
                timestamp: s.timestamp,
            }));
            view.series.push(SeriesRanges {
                labels: l0..view.labels.len(),
                samples: s0..view.samples.len(),
            });
        }
        view
    }

    /// Number of series.
    pub fn len(&self) -> usize {
        self.series.len()
    }

    /// True when the request has no series.
    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }

    /// The series, in the order they were sent.
    pub fn series(&self) -> impl ExactSizeIterator<Item = SeriesView<'_, 'a>> + '_ {
        self.series.iter().map(|s| SeriesView {
            labels: &self.labels[s.labels.clone()],
            samples: &self.samples[s.samples.clone()],
        })
    }

    fn decode_series(&mut self, raw: &'a [u8]) -> std::result::Result<(), WireError> {
        let l0 = self.labels.len();
        let s0 = self.samples.len();
        let mut r = Reader::new(raw);
        while let Some((field, wire)) = r.key()? {
            match field {
                1 => {
                    expect_len(wire, "TimeSeries.labels")?;
                    let label = decode_label(r.bytes()?)?;
                    self.labels.push(label);
                }
                2 => {
                    expect_len(wire, "TimeSeries.samples")?;
                    let sample = decode_sample(r.bytes()?)?;
                    self.samples.push(sample);
                }
                _ => r.skip(field, wire)?,
            }
        }
        self.series.push(SeriesRanges {
            labels: l0..self.labels.len(),
            samples: s0..self.samples.len(),
        });
        Ok(())
    }
}

fn decode_label(raw: &[u8]) -> std::result::Result<(&str, &str), WireError> {
    let (mut name, mut value) = ("", "");
    let mut r = Reader::new(raw);
    while let Some((field, wire)) = r.key()? {
        match field {
            1 => {
                expect_len(wire, "Label.name")?;
                name = utf8(r.bytes()?, "label name")?;
            }
            2 => {
                expect_len(wire, "Label.value")?;
                value = utf8(r.bytes()?, "label value")?;
            }
            _ => r.skip(field, wire)?,
        }
    }
    Ok((name, value))
}

fn decode_sample(raw: &[u8]) -> std::result::Result<SampleView, WireError> {
    let mut s = SampleView {
        value: 0.0,
        timestamp: 0,
    };
    let mut r = Reader::new(raw);
    while let Some((field, wire)) = r.key()? {
        match field {
            1 => {
                if wire != WIRE_I64 {
                    return Err(WireError::WireType("Sample.value", wire));
                }
                s.value = f64::from_bits(r.fixed64()?);
            }
            2 => {
                if wire != WIRE_VARINT {
                    return Err(WireError::WireType("Sample.timestamp", wire));
                }
                // int64 is sent as the two's complement of the value in a 64-bit varint.
                s.timestamp = r.varint()? as i64;
            }
            _ => r.skip(field, wire)?,
        }
    }
    Ok(s)
}

fn utf8<'a>(raw: &'a [u8], what: &'static str) -> std::result::Result<&'a str, WireError> {
    std::str::from_utf8(raw).map_err(|e| WireError::Utf8(what, e.valid_up_to()))
}

fn expect_len(wire: u8, field: &'static str) -> std::result::Result<(), WireError> {
    if wire == WIRE_LEN {
        Ok(())
    } else {
        Err(WireError::WireType(field, wire))
    }
}

const WIRE_VARINT: u8 = 0;
const WIRE_I64: u8 = 1;
const WIRE_LEN: u8 = 2;
const WIRE_START_GROUP: u8 = 3;
const WIRE_END_GROUP: u8 = 4;
const WIRE_I32: u8 = 5;

/// Groups nest at most this deep (prost's limit for nested messages is 100).
const MAX_GROUP_DEPTH: u32 = 100;

/// What was wrong with the bytes; turned into [`Error::Malformed`] with the series it was in.
/// `Copy` (no drop glue) so that the results of the hot reads cost nothing to discard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WireError {
    Truncated,
    VarintTooLong,
    KeyTooLarge,
    FieldZero,
    BadWireType(u8),
    WireType(&'static str, u8),
    Utf8(&'static str, usize),
    UnmatchedGroup,
    GroupTooDeep,
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Truncated => write!(f, "truncated message: a field runs past its end"),
            WireError::VarintTooLong => write!(f, "varint longer than 10 bytes"),
            WireError::KeyTooLarge => write!(f, "field key larger than 32 bits"),
            WireError::FieldZero => write!(f, "field number 0 is invalid"),
            WireError::BadWireType(w) => write!(f, "invalid wire type {w}"),
            WireError::WireType(field, w) => write!(f, "{field} sent with wire type {w}"),
            WireError::Utf8(what, at) => write!(f, "{what} is not valid utf-8 (at byte {at})"),
            WireError::UnmatchedGroup => write!(f, "end of a group that was never started"),
            WireError::GroupTooDeep => write!(f, "groups nested too deep"),
        }
    }
}

impl From<WireError> for Error {
    fn from(e: WireError) -> Self {
        Error::malformed("remote write protobuf", e)
    }
}

/// A cursor over protobuf bytes.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    #[inline]
    fn varint(&mut self) -> std::result::Result<u64, WireError> {
        // Keys and the lengths of labels and samples fit in one byte.
        if let Some(&b) = self.buf.get(self.pos)
            && b < 0x80
        {
            self.pos += 1;
            return Ok(u64::from(b));
        }
        self.varint_slow()
    }

    fn varint_slow(&mut self) -> std::result::Result<u64, WireError> {
        let mut out = 0u64;
        for i in 0..10 {
            let b = *self.buf.get(self.pos).ok_or(WireError::Truncated)?;
            self.pos += 1;
            out |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                // The tenth byte may only carry the top bit of the 64.
                if i == 9 && b > 1 {
                    return Err(WireError::VarintTooLong);
                }
                return Ok(out);
            }
        }
        Err(WireError::VarintTooLong)
    }

    /// The next field's number and wire type, or `None` at the end.
    #[inline]
    fn key(&mut self) -> std::result::Result<Option<(u32, u8)>, WireError> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let key = u32::try_from(self.varint()?).map_err(|_| WireError::KeyTooLarge)?;
        let wire = (key & 7) as u8;
        if wire > WIRE_I32 {
            return Err(WireError::BadWireType(wire));
        }
        let field = key >> 3;
        if field == 0 {
            return Err(WireError::FieldZero);
        }
        Ok(Some((field, wire)))
    }

    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], WireError> {
        let end = self.pos.checked_add(n).ok_or(WireError::Truncated)?;
        let out = self.buf.get(self.pos..end).ok_or(WireError::Truncated)?;
        self.pos = end;
        Ok(out)
    }

    fn bytes(&mut self) -> std::result::Result<&'a [u8], WireError> {
        let len = self.varint()?;
        let len = usize::try_from(len).map_err(|_| WireError::Truncated)?;
        self.take(len)
    }

    fn fixed64(&mut self) -> std::result::Result<u64, WireError> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes([
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
        ]))
    }

    /// Skips the value of a field nobody reads.
    fn skip(&mut self, field: u32, wire: u8) -> std::result::Result<(), WireError> {
        self.skip_depth(field, wire, 0)
    }

    fn skip_depth(
        &mut self,
        field: u32,
        wire: u8,
        depth: u32,
    ) -> std::result::Result<(), WireError> {
        match wire {
            WIRE_VARINT => self.varint().map(drop),
            WIRE_I64 => self.take(8).map(drop),
            WIRE_LEN => self.bytes().map(drop),
            WIRE_I32 => self.take(4).map(drop),
            WIRE_START_GROUP => {
                if depth >= MAX_GROUP_DEPTH {
                    return Err(WireError::GroupTooDeep);
                }
                loop {
                    let (f, w) = self.key()?.ok_or(WireError::Truncated)?;
                    if w == WIRE_END_GROUP {
                        return if f == field {
                            Ok(())
                        } else {
                            Err(WireError::UnmatchedGroup)
                        };
                    }
                    self.skip_depth(f, w, depth + 1)?;
                }
            }
            WIRE_END_GROUP => Err(WireError::UnmatchedGroup),
            w => Err(WireError::BadWireType(w)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::proto::{Label, Sample, TimeSeries};
    use super::*;
    use proptest::prelude::*;
    use prost::Message;

    fn request(series: &[(&[(&str, &str)], &[(i64, f64)])]) -> WriteRequest {
        WriteRequest {
            timeseries: series
                .iter()
                .map(|(labels, samples)| super::super::tests::series(labels, samples))
                .collect(),
        }
    }

    /// Equal, with NaN values compared by their bits.
    fn same(a: &WriteRequestView<'_>, b: &WriteRequestView<'_>) -> bool {
        let bits = |v: &WriteRequestView<'_>| {
            v.samples
                .iter()
                .map(|s| (s.value.to_bits(), s.timestamp))
                .collect::<Vec<_>>()
        };
        a.series == b.series && a.labels == b.labels && bits(a) == bits(b)
    }

    fn err(raw: &[u8]) -> String {
        WriteRequestView::decode(raw)
            .expect_err("malformed")
            .to_string()
    }

    /// Appends a length-delimited field.
    fn len_field(out: &mut Vec<u8>, field: u8, body: &[u8]) {
        out.push(field << 3 | WIRE_LEN);
        out.push(u8::try_from(body.len()).expect("short test field"));
        out.extend_from_slice(body);
    }

    #[test]
    fn reads_what_prost_writes() {
        let req = request(&[
            (
                &[("__name__", "up"), ("job", "dcgm"), ("empty", "")],
                &[(1_700_000_000_000, 1.0), (-5, f64::NAN)],
            ),
            (&[], &[]),
            (
                &[("ünïcode", "värde")],
                &[(i64::MIN, -0.0), (i64::MAX, 1e300)],
            ),
        ]);
        let raw = req.encode_to_vec();
        let view = WriteRequestView::decode(&raw).expect("valid");
        assert_eq!(view.len(), 3);
        let series: Vec<_> = view.series().collect();
        assert_eq!(
            series[0].labels,
            &[("__name__", "up"), ("job", "dcgm"), ("empty", "")]
        );
        assert_eq!(series[0].samples[0].timestamp, 1_700_000_000_000);
        assert_eq!(series[0].samples[1].timestamp, -5);
        assert!(series[0].samples[1].value.is_nan());
        assert!(series[1].labels.is_empty() && series[1].samples.is_empty());
        assert_eq!(series[2].labels, &[("ünïcode", "värde")]);
        assert_eq!(series[2].samples[0].timestamp, i64::MIN);
        assert_eq!(series[2].samples[1].value, 1e300);
        // prost leaves -0.0 out as the default, so compare with what prost reads back.
        let back = WriteRequest::decode(raw.as_slice()).expect("prost reads it");
        assert!(same(&view, &WriteRequestView::from_request(&back)));
    }

    #[test]
    fn unknown_fields_are_skipped_and_later_scalars_win() {
        let mut label = Vec::new();
        len_field(&mut label, 1, b"first");
        len_field(&mut label, 1, b"__name__");
        label.extend_from_slice(&[3 << 3, 0x96, 0x01]); // varint field 3
        label.extend_from_slice(&[4 << 3 | WIRE_I32, 1, 2, 3, 4]); // fixed32 field 4
        len_field(&mut label, 2, b"up");
        let mut sample = vec![2 << 3, 7, 2 << 3, 9];
        sample.push(1 << 3 | WIRE_I64);
        sample.extend_from_slice(&2.5f64.to_le_bytes());
        // A group (field 6) holding a varint, then its end.
        sample.extend_from_slice(&[
            6 << 3 | WIRE_START_GROUP,
            1 << 3,
            1,
            6 << 3 | WIRE_END_GROUP,
        ]);
        let mut series = Vec::new();
        len_field(&mut series, 1, &label);
        len_field(&mut series, 3, b"an exemplar");
        len_field(&mut series, 2, &sample);
        let mut raw = Vec::new();
        len_field(&mut raw, 3, b"metadata");
        len_field(&mut raw, 1, &series);
        let view = WriteRequestView::decode(&raw).expect("valid");
        let s = view.series().next().expect("one series");
        assert_eq!(s.labels, &[("__name__", "up")]);
        assert_eq!(
            s.samples,
            &[SampleView {
                value: 2.5,
                timestamp: 9
            }]
        );
        assert_eq!(
            WriteRequest::decode(raw.as_slice()).expect("prost agrees"),
            request(&[(&[("__name__", "up")], &[(9, 2.5)])])
        );
    }

    #[test]
    fn malformed_input_is_a_clear_error() {
        // A label value that is not UTF-8, in the second series.
        let mut label = Vec::new();
        len_field(&mut label, 1, b"job");
        len_field(&mut label, 2, b"ok\xff\xfe");
        let mut bad_series = Vec::new();
        len_field(&mut bad_series, 1, &label);
        let mut raw = Vec::new();
        len_field(&mut raw, 1, &[]);
        len_field(&mut raw, 1, &bad_series);
        let e = err(&raw);
        assert!(
            e.starts_with("malformed remote write protobuf")
                && e.contains("timeseries 1")
                && e.contains("label value is not valid utf-8 (at byte 2)"),
            "{e}"
        );
        // A label name that is not UTF-8.
        let mut label = Vec::new();
        len_field(&mut label, 1, b"\xc3");
        let mut series = Vec::new();
        len_field(&mut series, 1, &label);
        let mut raw = Vec::new();
        len_field(&mut raw, 1, &series);
        assert!(err(&raw).contains("label name is not valid utf-8"));

        // Every proper prefix of a valid request whose cut falls inside a field is truncated.
        let req = request(&[(&[("__name__", "up"), ("a", "b")], &[(1, 2.0), (3, 4.0)])]);
        let full = req.encode_to_vec();
        for cut in 1..full.len() {
            let e = err(&full[..cut]);
            assert!(e.contains("truncated"), "cut at {cut}: {e}");
        }

        assert!(err(b"\x0a\xff\xff").contains("truncated"));
        assert!(err(&[0x0a; 1]).contains("truncated"));
        assert!(err(&[0xff; 11]).contains("varint longer than 10 bytes"));
        assert!(err(&[0x00, 0x00]).contains("field number 0"));
        assert!(err(&[1 << 3 | 7]).contains("invalid wire type 7"));
        assert!(
            err(&[1 << 3 | WIRE_VARINT, 1]).contains(
                "WriteRequest.timeseries sent with wire type 0"
                    .to_lowercase()
                    .as_str()
            )
        );
        assert!(err(&[9 << 3 | WIRE_END_GROUP]).contains("never started"));
        assert!(err(&[9 << 3 | WIRE_START_GROUP]).contains("truncated"));
        assert!(
            err(&[9 << 3 | WIRE_START_GROUP, 8 << 3 | WIRE_END_GROUP]).contains("never started")
        );
        let deep = vec![9 << 3 | WIRE_START_GROUP; 200];
        assert!(err(&deep).contains("too deep"));
        // Sample fields with the wrong wire type.
        let mut series = Vec::new();
        len_field(&mut series, 2, &[1 << 3 | WIRE_VARINT, 1]);
        let mut raw = Vec::new();
        len_field(&mut raw, 1, &series);
        assert!(err(&raw).contains("sample.value sent with wire type 0"));
        let mut series = Vec::new();
        len_field(&mut series, 2, &[2 << 3 | WIRE_LEN, 0]);
        let mut raw = Vec::new();
        len_field(&mut raw, 1, &series);
        assert!(err(&raw).contains("sample.timestamp sent with wire type 2"));
    }

    fn arb_request() -> impl Strategy<Value = WriteRequest> {
        let label = (".{0,6}", ".{0,6}").prop_map(|(name, value)| Label { name, value });
        let sample =
            (any::<i64>(), any::<f64>()).prop_map(|(timestamp, value)| Sample { value, timestamp });
        let series = (
            prop::collection::vec(label, 0..5),
            prop::collection::vec(sample, 0..5),
        )
            .prop_map(|(labels, samples)| TimeSeries { labels, samples });
        prop::collection::vec(series, 0..5).prop_map(|timeseries| WriteRequest { timeseries })
    }

    proptest! {
        #[test]
        fn agrees_with_prost_on_valid_requests(req in arb_request()) {
            let raw = req.encode_to_vec();
            let view = WriteRequestView::decode(&raw).expect("valid");
            // Compared with prost reading the same bytes (it writes -0.0 as an absent field).
            let req = WriteRequest::decode(raw.as_slice()).expect("prost reads it");
            let back = WriteRequestView::from_request(&req);
            prop_assert!(same(&view, &back));
        }

        #[test]
        fn agrees_with_prost_on_arbitrary_bytes(raw in prop::collection::vec(any::<u8>(), 0..256)) {
            // Never panics; whatever prost accepts is read the same way.
            let ours = WriteRequestView::decode(&raw);
            if let Ok(req) = WriteRequest::decode(raw.as_slice()) {
                let ours = ours.expect("prost accepted it");
                prop_assert!(same(&ours, &WriteRequestView::from_request(&req)));
            }
        }
    }
}
