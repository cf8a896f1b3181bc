//! A small pretty JSON writer over serde, for `--once`.
//!
//! The agent keeps its dependency set small (serde_json is not among them); this covers what
//! `GpuSample` needs: structs, options, strings, numbers, sequences and maps. Non-finite floats
//! become `null`, as serde_json does.

use std::fmt::Write as _;

use serde::Serialize;
use serde::ser::{self, Impossible};

/// Error from the JSON writer (only for shapes JSON cannot express, e.g. non-string map keys).
#[derive(Debug)]
pub struct JsonError(String);

impl std::fmt::Display for JsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for JsonError {}

impl ser::Error for JsonError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        JsonError(msg.to_string())
    }
}

/// A JSON value tree, built by [`ValueSerializer`] and then printed.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Null,
    Bool(bool),
    /// Already formatted.
    Number(String),
    String(String),
    Array(Vec<Value>),
    Object(Vec<(String, Value)>),
}

/// `value` as pretty-printed JSON (two-space indent).
pub fn to_string_pretty<T: Serialize + ?Sized>(value: &T) -> Result<String, JsonError> {
    let tree = value.serialize(ValueSerializer)?;
    let mut out = String::new();
    write_value(&mut out, &tree, 0);
    Ok(out)
}

fn write_value(out: &mut String, v: &Value, indent: usize) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(n),
        Value::String(s) => write_string(out, s),
        Value::Array(items) if items.is_empty() => out.push_str("[]"),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline(out, indent + 1);
                write_value(out, item, indent + 1);
            }
            newline(out, indent);
            out.push(']');
        }
        Value::Object(fields) if fields.is_empty() => out.push_str("{}"),
        Value::Object(fields) => {
            out.push('{');
            for (i, (k, item)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline(out, indent + 1);
                write_string(out, k);
                out.push_str(": ");
                write_value(out, item, indent + 1);
            }
            newline(out, indent);
            out.push('}');
        }
    }
}

fn newline(out: &mut String, indent: usize) {
    out.push('\n');
    for _ in 0..indent {
        out.push_str("  ");
    }
}

fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn float(x: f64) -> Value {
    if !x.is_finite() {
        return Value::Null;
    }
    // Rust's shortest round-trip form; make integral values read as floats ("2.0").
    let s = format!("{x:?}");
    Value::Number(s)
}

struct ValueSerializer;

type R = Result<Value, JsonError>;

impl ser::Serializer for ValueSerializer {
    type Ok = Value;
    type Error = JsonError;
    type SerializeSeq = SeqBuilder;
    type SerializeTuple = SeqBuilder;
    type SerializeTupleStruct = SeqBuilder;
    type SerializeTupleVariant = VariantSeqBuilder;
    type SerializeMap = MapBuilder;
    type SerializeStruct = MapBuilder;
    type SerializeStructVariant = VariantMapBuilder;

    fn serialize_bool(self, v: bool) -> R {
        Ok(Value::Bool(v))
    }
    fn serialize_i8(self, v: i8) -> R {
        Ok(Value::Number(v.to_string()))
    }
    fn serialize_i16(self, v: i16) -> R {
        Ok(Value::Number(v.to_string()))
    }
    fn serialize_i32(self, v: i32) -> R {
        Ok(Value::Number(v.to_string()))
    }
    fn serialize_i64(self, v: i64) -> R {
        Ok(Value::Number(v.to_string()))
    }
    fn serialize_i128(self, v: i128) -> R {
        Ok(Value::Number(v.to_string()))
    }
    fn serialize_u8(self, v: u8) -> R {
        Ok(Value::Number(v.to_string()))
    }
    fn serialize_u16(self, v: u16) -> R {
        Ok(Value::Number(v.to_string()))
    }
    fn serialize_u32(self, v: u32) -> R {
        Ok(Value::Number(v.to_string()))
    }
    fn serialize_u64(self, v: u64) -> R {
        Ok(Value::Number(v.to_string()))
    }
    fn serialize_u128(self, v: u128) -> R {
        Ok(Value::Number(v.to_string()))
    }
    fn serialize_f32(self, v: f32) -> R {
        Ok(float(f64::from(v)))
    }
    fn serialize_f64(self, v: f64) -> R {
        Ok(float(v))
    }
    fn serialize_char(self, v: char) -> R {
        Ok(Value::String(v.to_string()))
    }
    fn serialize_str(self, v: &str) -> R {
        Ok(Value::String(v.to_string()))
    }
    fn serialize_bytes(self, v: &[u8]) -> R {
        Ok(Value::Array(
            v.iter().map(|b| Value::Number(b.to_string())).collect(),
        ))
    }
    fn serialize_none(self) -> R {
        Ok(Value::Null)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> R {
        value.serialize(self)
    }
    fn serialize_unit(self) -> R {
        Ok(Value::Null)
    }
    fn serialize_unit_struct(self, _name: &'static str) -> R {
        Ok(Value::Null)
    }
    fn serialize_unit_variant(self, _name: &'static str, _index: u32, variant: &'static str) -> R {
        Ok(Value::String(variant.to_string()))
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _name: &'static str, value: &T) -> R {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> R {
        Ok(Value::Object(vec![(
            variant.to_string(),
            value.serialize(ValueSerializer)?,
        )]))
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<SeqBuilder, JsonError> {
        Ok(SeqBuilder(Vec::with_capacity(len.unwrap_or(0))))
    }
    fn serialize_tuple(self, len: usize) -> Result<SeqBuilder, JsonError> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        len: usize,
    ) -> Result<SeqBuilder, JsonError> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<VariantSeqBuilder, JsonError> {
        Ok(VariantSeqBuilder(
            variant,
            SeqBuilder(Vec::with_capacity(len)),
        ))
    }
    fn serialize_map(self, len: Option<usize>) -> Result<MapBuilder, JsonError> {
        Ok(MapBuilder {
            fields: Vec::with_capacity(len.unwrap_or(0)),
            key: None,
        })
    }
    fn serialize_struct(self, _name: &'static str, len: usize) -> Result<MapBuilder, JsonError> {
        self.serialize_map(Some(len))
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<VariantMapBuilder, JsonError> {
        Ok(VariantMapBuilder(variant, self.serialize_map(Some(len))?))
    }
}

struct SeqBuilder(Vec<Value>);

impl ser::SerializeSeq for SeqBuilder {
    type Ok = Value;
    type Error = JsonError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), JsonError> {
        self.0.push(value.serialize(ValueSerializer)?);
        Ok(())
    }
    fn end(self) -> R {
        Ok(Value::Array(self.0))
    }
}

impl ser::SerializeTuple for SeqBuilder {
    type Ok = Value;
    type Error = JsonError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), JsonError> {
        ser::SerializeSeq::serialize_element(self, value)
    }
    fn end(self) -> R {
        ser::SerializeSeq::end(self)
    }
}

impl ser::SerializeTupleStruct for SeqBuilder {
    type Ok = Value;
    type Error = JsonError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), JsonError> {
        ser::SerializeSeq::serialize_element(self, value)
    }
    fn end(self) -> R {
        ser::SerializeSeq::end(self)
    }
}

struct VariantSeqBuilder(&'static str, SeqBuilder);

impl ser::SerializeTupleVariant for VariantSeqBuilder {
    type Ok = Value;
    type Error = JsonError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), JsonError> {
        ser::SerializeSeq::serialize_element(&mut self.1, value)
    }
    fn end(self) -> R {
        Ok(Value::Object(vec![(
            self.0.to_string(),
            Value::Array(self.1.0),
        )]))
    }
}

struct MapBuilder {
    fields: Vec<(String, Value)>,
    key: Option<String>,
}

impl ser::SerializeMap for MapBuilder {
    type Ok = Value;
    type Error = JsonError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), JsonError> {
        self.key = Some(key.serialize(KeySerializer)?);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), JsonError> {
        let key = self
            .key
            .take()
            .ok_or_else(|| JsonError("map value without a key".to_string()))?;
        self.fields.push((key, value.serialize(ValueSerializer)?));
        Ok(())
    }
    fn end(self) -> R {
        Ok(Value::Object(self.fields))
    }
}

impl ser::SerializeStruct for MapBuilder {
    type Ok = Value;
    type Error = JsonError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), JsonError> {
        self.fields
            .push((key.to_string(), value.serialize(ValueSerializer)?));
        Ok(())
    }
    fn end(self) -> R {
        Ok(Value::Object(self.fields))
    }
}

struct VariantMapBuilder(&'static str, MapBuilder);

impl ser::SerializeStructVariant for VariantMapBuilder {
    type Ok = Value;
    type Error = JsonError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), JsonError> {
        ser::SerializeStruct::serialize_field(&mut self.1, key, value)
    }
    fn end(self) -> R {
        Ok(Value::Object(vec![(
            self.0.to_string(),
            Value::Object(self.1.fields),
        )]))
    }
}

/// Map keys must be strings (numbers and chars are written as their text).
struct KeySerializer;

fn key_error() -> JsonError {
    JsonError("json object keys must be strings".to_string())
}

impl ser::Serializer for KeySerializer {
    type Ok = String;
    type Error = JsonError;
    type SerializeSeq = Impossible<String, JsonError>;
    type SerializeTuple = Impossible<String, JsonError>;
    type SerializeTupleStruct = Impossible<String, JsonError>;
    type SerializeTupleVariant = Impossible<String, JsonError>;
    type SerializeMap = Impossible<String, JsonError>;
    type SerializeStruct = Impossible<String, JsonError>;
    type SerializeStructVariant = Impossible<String, JsonError>;

    fn serialize_bool(self, v: bool) -> Result<String, JsonError> {
        Ok(v.to_string())
    }
    fn serialize_i8(self, v: i8) -> Result<String, JsonError> {
        Ok(v.to_string())
    }
    fn serialize_i16(self, v: i16) -> Result<String, JsonError> {
        Ok(v.to_string())
    }
    fn serialize_i32(self, v: i32) -> Result<String, JsonError> {
        Ok(v.to_string())
    }
    fn serialize_i64(self, v: i64) -> Result<String, JsonError> {
        Ok(v.to_string())
    }
    fn serialize_u8(self, v: u8) -> Result<String, JsonError> {
        Ok(v.to_string())
    }
    fn serialize_u16(self, v: u16) -> Result<String, JsonError> {
        Ok(v.to_string())
    }
    fn serialize_u32(self, v: u32) -> Result<String, JsonError> {
        Ok(v.to_string())
    }
    fn serialize_u64(self, v: u64) -> Result<String, JsonError> {
        Ok(v.to_string())
    }
    fn serialize_f32(self, _v: f32) -> Result<String, JsonError> {
        Err(key_error())
    }
    fn serialize_f64(self, _v: f64) -> Result<String, JsonError> {
        Err(key_error())
    }
    fn serialize_char(self, v: char) -> Result<String, JsonError> {
        Ok(v.to_string())
    }
    fn serialize_str(self, v: &str) -> Result<String, JsonError> {
        Ok(v.to_string())
    }
    fn serialize_bytes(self, _v: &[u8]) -> Result<String, JsonError> {
        Err(key_error())
    }
    fn serialize_none(self) -> Result<String, JsonError> {
        Err(key_error())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<String, JsonError> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<String, JsonError> {
        Err(key_error())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<String, JsonError> {
        Err(key_error())
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<String, JsonError> {
        Ok(variant.to_string())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<String, JsonError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<String, JsonError> {
        Err(key_error())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, JsonError> {
        Err(key_error())
    }
    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, JsonError> {
        Err(key_error())
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleStruct, JsonError> {
        Err(key_error())
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, JsonError> {
        Err(key_error())
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, JsonError> {
        Err(key_error())
    }
    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStruct, JsonError> {
        Err(key_error())
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, JsonError> {
        Err(key_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::{GpuSample, JobLabels};
    use std::collections::BTreeMap;

    #[test]
    fn sample_as_json() {
        let mut s = GpuSample::empty(
            1_795_331_484_576_304_098,
            "GPU-\"q\"".into(),
            3,
            "H100".into(),
        );
        s.job = Some(JobLabels {
            id: "9101".into(),
            user: "alice".into(),
            name: "train\nllm".into(),
            scheduler: "slurm".into(),
        });
        s.gpu_utilization = Some(1.0);
        s.power_watts = Some(697.507);
        s.memory_used_bytes = Some(1_429_012_480);
        s.energy_joules = Some(f64::NAN);
        let text = to_string_pretty(&vec![s]).unwrap();
        assert!(
            text.starts_with("[\n  {\n    \"time_unix_nano\": 1795331484576304098,\n"),
            "{text}"
        );
        assert!(text.contains("\"gpu_uuid\": \"GPU-\\\"q\\\"\""));
        assert!(text.contains("\"gpu_index\": 3,"));
        assert!(text.contains("\"mig_instance\": null,"));
        assert!(text.contains("\"job\": {\n      \"id\": \"9101\","));
        assert!(text.contains("\"name\": \"train\\nllm\""));
        assert!(text.contains("\"gpu_utilization\": 1.0,"));
        assert!(text.contains("\"power_watts\": 697.507,"));
        assert!(text.contains("\"memory_used_bytes\": 1429012480,"));
        assert!(text.contains("\"energy_joules\": null,"));
        assert!(text.ends_with("\n  }\n]"));
    }

    #[test]
    fn maps_and_empties() {
        let mut m = BTreeMap::new();
        m.insert(1u32, vec![true]);
        m.insert(2u32, vec![]);
        assert_eq!(
            to_string_pretty(&m).unwrap(),
            "{\n  \"1\": [\n    true\n  ],\n  \"2\": []\n}"
        );
        let empty: Vec<u8> = Vec::new();
        assert_eq!(to_string_pretty(&empty).unwrap(), "[]");
        let mut bad = BTreeMap::new();
        bad.insert(vec![1u8], 1);
        assert!(to_string_pretty(&bad).is_err());
    }
}
