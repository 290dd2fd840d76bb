//! `metav1.Duration`: a signed duration stored as a Go duration string (`"1h30m0s"`).

use std::borrow::Cow;
use std::fmt;

use jiff::SignedDuration;

/// A duration that serialises like Go's `time.Duration.String()` and parses like
/// `time.ParseDuration` (the representation of `metav1.Duration` in CRDs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct GoDuration(pub SignedDuration);

/// A string that is not a Go duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: {reason}")]
pub struct DurationError {
    /// The offending text.
    pub input: String,
    /// What is wrong with it.
    pub reason: String,
}

const NANOS_PER_SEC: i128 = 1_000_000_000;

impl GoDuration {
    /// From whole seconds.
    pub fn from_secs(secs: i64) -> Self {
        Self(SignedDuration::from_secs(secs))
    }

    /// The duration as nanoseconds.
    pub fn as_nanos(self) -> i128 {
        self.0.as_nanos()
    }

    /// Parse Go's `time.ParseDuration` syntax: `[-+]?([0-9]*(\.[0-9]*)?unit)+` with units
    /// `ns`, `us`, `µs`, `μs`, `ms`, `s`, `m`, `h`, or a bare `0`. The range is Go's (±~292 years).
    pub fn parse(s: &str) -> Result<Self, DurationError> {
        let err = |reason: &str| DurationError {
            input: s.to_string(),
            reason: reason.to_string(),
        };
        let (negative, mut rest) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, s),
        };
        if rest == "0" {
            return Ok(Self::default());
        }
        if rest.is_empty() {
            return Err(err("empty duration"));
        }
        let mut total: i128 = 0;
        while !rest.is_empty() {
            let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
            let (int_part, after) = rest.split_at(int_len);
            let (frac_part, after) = match after.strip_prefix('.') {
                Some(a) => {
                    let n = a.bytes().take_while(u8::is_ascii_digit).count();
                    a.split_at(n)
                }
                None => ("", after),
            };
            if int_part.is_empty() && frac_part.is_empty() {
                return Err(err("expected a number"));
            }
            let unit_len = after
                .char_indices()
                .find(|(_, c)| c.is_ascii_digit() || *c == '.')
                .map_or(after.len(), |(i, _)| i);
            let (unit, after) = after.split_at(unit_len);
            let unit_nanos: i128 = match unit {
                "ns" => 1,
                "us" | "µs" | "μs" => 1_000,
                "ms" => 1_000_000,
                "s" => NANOS_PER_SEC,
                "m" => 60 * NANOS_PER_SEC,
                "h" => 3600 * NANOS_PER_SEC,
                "" => return Err(err("missing unit (ns, us, ms, s, m or h)")),
                _ => return Err(err(&format!("unknown unit {unit:?}"))),
            };
            let int: i128 = if int_part.is_empty() {
                0
            } else {
                int_part
                    .parse::<i128>()
                    .map_err(|_| err("number out of range"))?
            };
            let mut value = int
                .checked_mul(unit_nanos)
                .ok_or_else(|| err("out of range"))?;
            // Fraction: digits / 10^len, scaled by the unit, truncated (as Go).
            let mut scale = unit_nanos;
            for d in frac_part.bytes().take(30) {
                scale /= 10;
                if scale == 0 {
                    break;
                }
                value += i128::from(d - b'0') * scale;
            }
            total = total
                .checked_add(value)
                .ok_or_else(|| err("out of range"))?;
            if total > i128::from(i64::MAX) + i128::from(negative) {
                return Err(err("out of range"));
            }
            rest = after;
        }
        let nanos = if negative { -total } else { total };
        Ok(Self(SignedDuration::from_nanos_i128(nanos)))
    }
}

impl fmt::Display for GoDuration {
    /// Go's `time.Duration.String()`: `"1h0m0s"`, `"1m30s"`, `"1.5s"`, `"500ms"`, `"0s"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nanos = self.0.as_nanos();
        if nanos == 0 {
            return f.write_str("0s");
        }
        let sign = if nanos < 0 { "-" } else { "" };
        let n = nanos.unsigned_abs();
        let frac = |value: u128, digits: u32| -> String {
            // value is in units of 10^-digits; print with trailing zeros trimmed.
            let base = 10u128.pow(digits);
            let whole = value / base;
            let part = value % base;
            if part == 0 {
                whole.to_string()
            } else {
                let s = format!("{part:0width$}", width = digits as usize);
                format!("{whole}.{}", s.trim_end_matches('0'))
            }
        };
        if n < 1_000 {
            return write!(f, "{sign}{n}ns");
        }
        if n < 1_000_000 {
            return write!(f, "{sign}{}µs", frac(n, 3));
        }
        if n < NANOS_PER_SEC as u128 {
            return write!(f, "{sign}{}ms", frac(n, 6));
        }
        let total_secs = n / NANOS_PER_SEC as u128;
        let sub = n % NANOS_PER_SEC as u128;
        let hours = total_secs / 3600;
        let minutes = (total_secs % 3600) / 60;
        let secs = frac((total_secs % 60) * NANOS_PER_SEC as u128 + sub, 9);
        if hours > 0 {
            write!(f, "{sign}{hours}h{minutes}m{secs}s")
        } else if minutes > 0 {
            write!(f, "{sign}{minutes}m{secs}s")
        } else {
            write!(f, "{sign}{secs}s")
        }
    }
}

impl From<SignedDuration> for GoDuration {
    fn from(d: SignedDuration) -> Self {
        Self(d)
    }
}

impl From<GoDuration> for prost_types::Duration {
    fn from(d: GoDuration) -> Self {
        prost_types::Duration {
            seconds: d.0.as_secs(),
            nanos: d.0.subsec_nanos(),
        }
    }
}

impl TryFrom<&prost_types::Duration> for GoDuration {
    type Error = DurationError;
    fn try_from(d: &prost_types::Duration) -> Result<Self, Self::Error> {
        // google.protobuf.Duration: nanos within ±999,999,999, of the same sign as seconds.
        if !(-999_999_999..=999_999_999).contains(&d.nanos)
            || (d.seconds > 0 && d.nanos < 0)
            || (d.seconds < 0 && d.nanos > 0)
        {
            return Err(DurationError {
                input: format!("{}s {}ns", d.seconds, d.nanos),
                reason: "nanos must be within ±999999999 and of the same sign as seconds".into(),
            });
        }
        let nanos = i128::from(d.seconds) * NANOS_PER_SEC + i128::from(d.nanos);
        if nanos.unsigned_abs() > i64::MAX as u128 {
            return Err(DurationError {
                input: format!("{}s {}ns", d.seconds, d.nanos),
                reason: "out of range (a Kubernetes duration is at most ~292 years)".into(),
            });
        }
        Ok(Self(SignedDuration::from_nanos_i128(nanos)))
    }
}

impl serde::Serialize for GoDuration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for GoDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <Cow<'de, str>>::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl schemars::JsonSchema for GoDuration {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string" })
    }

    fn inline_schema() -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> GoDuration {
        GoDuration::parse(s).unwrap()
    }

    #[test]
    fn formats_like_go() {
        let cases = [
            (0i128, "0s"),
            (1, "1ns"),
            (1_100, "1.1µs"),
            (2_200_000, "2.2ms"),
            (1_500_000_000, "1.5s"),
            (90 * NANOS_PER_SEC, "1m30s"),
            (3600 * NANOS_PER_SEC, "1h0m0s"),
            (-(3661 * NANOS_PER_SEC + 1), "-1h1m1.000000001s"),
            (30 * 60 * NANOS_PER_SEC, "30m0s"),
        ];
        for (n, s) in cases {
            let g = GoDuration(SignedDuration::from_nanos_i128(n));
            assert_eq!(g.to_string(), s);
            assert_eq!(d(s), g, "{s}");
        }
    }

    #[test]
    fn parses_go_syntax() {
        assert_eq!(d("1.5h").0, SignedDuration::from_secs(5400));
        assert_eq!(d("1h30m").0, SignedDuration::from_secs(5400));
        assert_eq!(d("+2s").0, SignedDuration::from_secs(2));
        assert_eq!(d("-0").0, SignedDuration::ZERO);
        assert_eq!(d(".5s").0, SignedDuration::from_millis(500));
        assert_eq!(d("1us").0, SignedDuration::from_micros(1));
        assert_eq!(d("1μs").0, SignedDuration::from_micros(1));
        assert_eq!(d("2562047h").0, SignedDuration::from_hours(2562047));
    }

    #[test]
    fn rejects_bad_durations() {
        for (s, why) in [
            ("", "empty"),
            ("1", "missing unit"),
            ("1d", "unknown unit \"d\""),
            ("h", "expected a number"),
            ("1h-2m", "unknown unit \"h-\""),
            ("3000000h", "out of range"),
            ("-", "empty"),
            (".s", "expected a number"),
        ] {
            let e = GoDuration::parse(s).unwrap_err().to_string();
            assert!(e.contains(why), "{s:?}: {e}");
        }
    }

    #[test]
    fn serde_and_proto_round_trip() {
        let g = d("1h2m3.5s");
        let json = serde_json::to_string(&g).unwrap();
        assert_eq!(json, "\"1h2m3.5s\"");
        assert_eq!(serde_json::from_str::<GoDuration>(&json).unwrap(), g);
        assert!(serde_json::from_str::<GoDuration>("\"1 hour\"").is_err());
        let p: prost_types::Duration = g.into();
        assert_eq!((p.seconds, p.nanos), (3723, 500_000_000));
        assert_eq!(GoDuration::try_from(&p).unwrap(), g);
        let huge = prost_types::Duration {
            seconds: i64::MAX,
            nanos: 0,
        };
        assert!(GoDuration::try_from(&huge).is_err());
    }

    #[test]
    fn proto_nanos_out_of_range_are_refused() {
        for (seconds, nanos) in [
            (0, 1_000_000_000),
            (0, -1_000_000_000),
            (1, i32::MAX),
            (5, -1),
            (-5, 1),
        ] {
            let e = GoDuration::try_from(&prost_types::Duration { seconds, nanos }).unwrap_err();
            assert!(e.to_string().contains("nanos"), "{seconds}s {nanos}ns: {e}");
        }
        for (seconds, nanos) in [(0, 999_999_999), (0, -999_999_999), (-1, -5), (1, 5)] {
            assert!(GoDuration::try_from(&prost_types::Duration { seconds, nanos }).is_ok());
        }
    }
}
