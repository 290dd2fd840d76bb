//! Sizes such as `512M` or `20G`, as upstream's board reads them (pydantic `ByteSize`, a bare
//! `K`/`M`/`G`/`T` taken as binary: `512M` is 512 MiB).

/// A size that is not one.
#[derive(Debug, thiserror::Error)]
#[error("invalid size: {0:?}; use e.g. 20G, 512M, 2T")]
pub struct SizeError(String);

/// Parses a size into bytes: a number (decimals allowed) and an optional unit: `B`,
/// `K`/`M`/`G`/`T`/`P`/`E` (binary, as upstream), `KB`.. (decimal), `KiB`.. (binary); case
/// does not matter.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let bad = || SizeError(text.to_string());
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(bad());
    }
    let value: f64 = num.parse().map_err(|_| bad())?;
    let unit = unit.trim().to_ascii_lowercase();
    let (base, power): (f64, i32) = match unit.as_str() {
        "" | "b" => (1.0, 0),
        _ => {
            let exp = "kmgtpe"
                .find(unit.chars().next().ok_or_else(bad)?)
                .ok_or_else(bad)? as i32
                + 1;
            match &unit[1..] {
                "" | "ib" => (1024.0, exp),
                "b" => (1000.0, exp),
                _ => return Err(bad()),
            }
        }
    };
    let bytes = value * base.powi(power);
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(bad());
    }
    Ok(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_as_upstream() {
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("20G").unwrap(), 20 << 30);
        assert_eq!(parse_size("2t").unwrap(), 2 << 40);
        assert_eq!(parse_size("1.5K").unwrap(), 1536);
        assert_eq!(parse_size("1KB").unwrap(), 1000);
        assert_eq!(parse_size("1 MiB").unwrap(), 1 << 20);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        for bad in ["", "G", "-1G", "1Q", "1GiBs", "1..2M", "1e99E"] {
            assert!(parse_size(bad).is_err(), "{bad:?} accepted");
        }
    }
}
