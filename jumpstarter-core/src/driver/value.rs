//! The one conversion between `google.protobuf.Value` and serde types.
//!
//! Driver-call arguments and results travel as `google.protobuf.Value`, encoded the way the
//! upstream Python tools do it (pydantic JSON mode, then `json_format.ParseDict`):
//!
//! - every number is a double, so an integer `1` arrives as `1.0`; decoding into an integer
//!   type accepts any integral double;
//! - bytes travel as UTF-8 text (use [`utf8_bytes`] for `Vec<u8>` fields);
//! - durations travel as ISO-8601 strings such as `PT3S` (use [`iso8601`]);
//! - structs and maps are `struct_value`, sequences are `list_value`, `None` is `null_value`.

use prost_types::value::Kind;
pub use prost_types::{ListValue, Struct, Value};
use serde::{Serialize, de::DeserializeOwned};

use super::error::DriverError;

/// Why a value could not be converted.
#[derive(Debug, thiserror::Error)]
pub enum ValueError {
    /// The value does not have the shape the target type expects.
    #[error(transparent)]
    Shape(serde_json::Error),
}

impl From<ValueError> for DriverError {
    fn from(e: ValueError) -> Self {
        DriverError::invalid(e)
    }
}

/// Encodes any serde value as a `google.protobuf.Value`.
pub fn to_value<T: Serialize + ?Sized>(v: &T) -> Result<Value, ValueError> {
    let json = serde_json::to_value(v).map_err(ValueError::Shape)?;
    Ok(from_json(json))
}

/// Decodes a `google.protobuf.Value` into a serde type.
pub fn from_value<T: DeserializeOwned>(v: Value) -> Result<T, ValueError> {
    serde_json::from_value(to_json(v)).map_err(ValueError::Shape)
}

/// Converts JSON into a `google.protobuf.Value` (numbers become doubles).
pub fn from_json(v: serde_json::Value) -> Value {
    let kind = match v {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(f64::NAN)),
        serde_json::Value::String(s) => Kind::StringValue(s),
        serde_json::Value::Array(a) => Kind::ListValue(ListValue {
            values: a.into_iter().map(from_json).collect(),
        }),
        serde_json::Value::Object(o) => Kind::StructValue(Struct {
            fields: o.into_iter().map(|(k, v)| (k, from_json(v))).collect(),
        }),
    };
    Value { kind: Some(kind) }
}

/// Converts a `google.protobuf.Value` into JSON.
///
/// Integral doubles within the exactly representable range become JSON integers, so that
/// they decode into integer types as well as floats; non-finite doubles become `null`.
pub fn to_json(v: Value) -> serde_json::Value {
    match v.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::BoolValue(b)) => serde_json::Value::Bool(b),
        Some(Kind::NumberValue(n)) => number_to_json(n),
        Some(Kind::StringValue(s)) => serde_json::Value::String(s),
        Some(Kind::ListValue(l)) => {
            serde_json::Value::Array(l.values.into_iter().map(to_json).collect())
        }
        Some(Kind::StructValue(s)) => {
            serde_json::Value::Object(s.fields.into_iter().map(|(k, v)| (k, to_json(v))).collect())
        }
    }
}

fn number_to_json(n: f64) -> serde_json::Value {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    if n.is_finite() && n.fract() == 0.0 && n.abs() <= EXACT {
        // The range check above makes the cast exact.
        #[allow(clippy::cast_possible_truncation)]
        let i = n as i64;
        return serde_json::Value::from(i);
    }
    serde_json::Number::from_f64(n)
        .map(serde_json::Value::Number)
        .unwrap_or(serde_json::Value::Null)
}

/// Decodes positional driver-call arguments, with the error texts upstream gives.
pub struct ArgDecoder {
    args: std::vec::IntoIter<Value>,
}

impl ArgDecoder {
    /// Checks the argument count for `Type.method()` taking `expected` arguments.
    ///
    /// Missing trailing arguments decode as `null` (so `Option` parameters may be left out);
    /// extra arguments are an error.
    pub fn new(
        type_name: &str,
        method: &str,
        args: Vec<Value>,
        expected: usize,
    ) -> Result<Self, DriverError> {
        if args.len() > expected {
            let plural = if expected == 0 { "" } else { "s" };
            return Err(DriverError::Failed(format!(
                "{type_name}.{method}() takes {} positional argument{plural} but {} were given",
                expected + 1,
                args.len() + 1
            )));
        }
        Ok(Self {
            args: args.into_iter(),
        })
    }

    /// Decodes the next argument.
    pub fn next_arg<T: DeserializeOwned>(&mut self) -> Result<T, DriverError> {
        let v = self.args.next().unwrap_or(Value {
            kind: Some(Kind::NullValue(0)),
        });
        from_value(v).map_err(DriverError::invalid)
    }
}

/// Serde helpers for bytes that travel as UTF-8 text, as upstream's pydantic does.
pub mod utf8_bytes {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    /// Serializes bytes as a UTF-8 string (fails on invalid UTF-8, as upstream does).
    pub fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(b) {
            Ok(text) => s.serialize_str(text),
            Err(e) => Err(serde::ser::Error::custom(format!(
                "bytes are not valid UTF-8: {e}",
                e = crate::error_chain(&e)
            ))),
        }
    }

    /// Deserializes a string into its UTF-8 bytes.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        String::deserialize(d)
            .map(String::into_bytes)
            .map_err(D::Error::custom)
    }
}

/// Serde helpers for `std::time::Duration` as an ISO-8601 duration (`PT1.5S`), accepting a
/// plain number of seconds too.
pub mod iso8601 {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};
    use std::time::Duration;

    /// Formats a duration as ISO-8601, the way pydantic does (`PT3S`, `PT0.5S`, `P1DT2H`).
    pub fn format(d: Duration) -> String {
        let total = d.as_secs();
        let days = total / 86_400;
        let hours = (total % 86_400) / 3600;
        let minutes = (total % 3600) / 60;
        let secs = total % 60;
        let nanos = d.subsec_nanos();
        let mut out = String::from("P");
        if days > 0 {
            out.push_str(&format!("{days}D"));
        }
        out.push('T');
        if hours > 0 {
            out.push_str(&format!("{hours}H"));
        }
        if minutes > 0 {
            out.push_str(&format!("{minutes}M"));
        }
        if nanos > 0 {
            let frac = format!("{:09}", nanos);
            out.push_str(&format!("{secs}.{}S", frac.trim_end_matches('0')));
        } else if secs > 0 || out.ends_with('T') {
            out.push_str(&format!("{secs}S"));
        }
        if out.ends_with('T') {
            out.pop();
        }
        out
    }

    /// Parses an ISO-8601 duration such as `PT3S` or `P1DT2H30M`.
    pub fn parse(s: &str) -> Option<Duration> {
        let rest = s.strip_prefix('P')?;
        let (date, time) = match rest.split_once('T') {
            Some((d, t)) => (d, t),
            None => (rest, ""),
        };
        let mut secs = 0f64;
        let mut any = false;
        for (part, units) in [
            (date, &[('W', 604_800.0), ('D', 86_400.0)][..]),
            (time, &[('H', 3600.0), ('M', 60.0), ('S', 1.0)][..]),
        ] {
            let mut num = String::new();
            for c in part.chars() {
                if c.is_ascii_digit() || c == '.' {
                    num.push(c);
                    continue;
                }
                let mult = units.iter().find(|(u, _)| *u == c)?.1;
                secs += num.parse::<f64>().ok()? * mult;
                num.clear();
                any = true;
            }
            if !num.is_empty() {
                return None;
            }
        }
        if !any || !secs.is_finite() || secs < 0.0 {
            return None;
        }
        Some(Duration::from_secs_f64(secs))
    }

    /// Serializes as ISO-8601.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format(*d))
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Secs(f64),
        Text(String),
    }

    /// Deserializes ISO-8601 text or a number of seconds.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        match Repr::deserialize(d)? {
            Repr::Secs(f) if f.is_finite() && f >= 0.0 => Ok(Duration::from_secs_f64(f)),
            Repr::Secs(f) => Err(D::Error::custom(format!("invalid duration: {f}"))),
            Repr::Text(t) => {
                parse(&t).ok_or_else(|| D::Error::custom(format!("invalid duration: {t:?}")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::time::Duration;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Reading {
        voltage: f64,
        current: f64,
        count: u32,
        #[serde(with = "utf8_bytes")]
        data: Vec<u8>,
        #[serde(with = "iso8601")]
        wait: Duration,
        note: Option<String>,
    }

    #[test]
    fn round_trip_keeps_upstream_quirks() {
        let r = Reading {
            voltage: 5.0,
            current: 2.5,
            count: 3,
            data: b"ab".to_vec(),
            wait: Duration::from_secs(3),
            note: None,
        };
        let v = to_value(&r).unwrap();
        let Some(Kind::StructValue(s)) = &v.kind else {
            panic!("not a struct: {v:?}")
        };
        assert_eq!(s.fields["count"].kind, Some(Kind::NumberValue(3.0)));
        assert_eq!(s.fields["data"].kind, Some(Kind::StringValue("ab".into())));
        assert_eq!(
            s.fields["wait"].kind,
            Some(Kind::StringValue("PT3S".into()))
        );
        assert_eq!(s.fields["note"].kind, Some(Kind::NullValue(0)));
        assert_eq!(from_value::<Reading>(v).unwrap(), r);
    }

    #[test]
    fn integers_arrive_as_doubles() {
        let v = Value {
            kind: Some(Kind::NumberValue(1.0)),
        };
        assert_eq!(from_value::<u8>(v.clone()).unwrap(), 1);
        assert_eq!(from_value::<f64>(v).unwrap(), 1.0);
        let half = Value {
            kind: Some(Kind::NumberValue(1.5)),
        };
        assert!(from_value::<u8>(half).is_err());
    }

    #[test]
    fn durations() {
        for (d, s) in [
            (Duration::from_secs(3), "PT3S"),
            (Duration::from_millis(500), "PT0.5S"),
            (Duration::from_secs(93_784), "P1DT2H3M4S"),
            (Duration::ZERO, "PT0S"),
        ] {
            assert_eq!(iso8601::format(d), s);
            assert_eq!(iso8601::parse(s), Some(d));
        }
        assert_eq!(iso8601::parse("bogus"), None);
        assert_eq!(iso8601::parse("PT"), None);
        assert_eq!(iso8601::parse("PT5X"), None);
    }

    #[test]
    fn arity_errors_read_like_upstream() {
        let e = ArgDecoder::new("MockPower", "on", vec![to_value(&1).unwrap()], 0)
            .err()
            .unwrap();
        assert_eq!(
            e.to_string(),
            "MockPower.on() takes 1 positional argument but 2 were given"
        );
    }

    #[test]
    fn non_finite_numbers_become_null() {
        let v = Value {
            kind: Some(Kind::NumberValue(f64::NAN)),
        };
        assert_eq!(to_json(v), serde_json::Value::Null);
    }
}
