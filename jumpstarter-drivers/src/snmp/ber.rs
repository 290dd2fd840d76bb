//! The few BER (X.690) encodings SNMPv3 messages use: INTEGER, OCTET STRING, NULL, OBJECT
//! IDENTIFIER, SEQUENCE and the context-tagged PDUs, with definite lengths only.

use super::error::SnmpError;

/// INTEGER.
pub const INTEGER: u8 = 0x02;
/// OCTET STRING.
pub const OCTET_STRING: u8 = 0x04;
/// OBJECT IDENTIFIER.
pub const OID: u8 = 0x06;
/// SEQUENCE.
pub const SEQUENCE: u8 = 0x30;
/// GetRequest-PDU.
pub const GET_REQUEST: u8 = 0xa0;
/// Response-PDU.
pub const RESPONSE: u8 = 0xa2;
/// SetRequest-PDU.
pub const SET_REQUEST: u8 = 0xa3;
/// Report-PDU.
pub const REPORT: u8 = 0xa8;

/// Appends a tag-length-value with `content` to `out`.
pub fn tlv(out: &mut Vec<u8>, tag: u8, content: &[u8]) {
    out.push(tag);
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
}

/// Appends an INTEGER (two's complement, shortest form).
pub fn integer(out: &mut Vec<u8>, v: i64) {
    let bytes = v.to_be_bytes();
    let mut start = 0;
    while start < 7 {
        let (b, next) = (bytes[start], bytes[start + 1]);
        if (b == 0 && next & 0x80 == 0) || (b == 0xff && next & 0x80 != 0) {
            start += 1;
        } else {
            break;
        }
    }
    tlv(out, INTEGER, &bytes[start..]);
}

/// Appends an OCTET STRING.
pub fn octets(out: &mut Vec<u8>, v: &[u8]) {
    tlv(out, OCTET_STRING, v);
}

/// Appends an OBJECT IDENTIFIER: at least two arcs, the first 0, 1 or 2, the second below
/// 40 unless the first is 2, and a first subidentifier (`40 * first + second`) that fits in
/// 32 bits, as agents read it. Anything else is refused, naming the OID, and nothing is
/// appended.
pub fn oid(out: &mut Vec<u8>, arcs: &[u32]) -> Result<(), SnmpError> {
    let bad = |why: &str| SnmpError::BadOid {
        oid: arcs
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join("."),
        why: why.to_string(),
    };
    let (first, rest) = match arcs {
        [a, b, rest @ ..] => {
            if *a > 2 {
                return Err(bad("its first arc is not 0, 1 or 2"));
            }
            if *a < 2 && *b >= 40 {
                return Err(bad("its second arc is not below 40"));
            }
            let first = a.checked_mul(40).and_then(|f| f.checked_add(*b)).ok_or_else(|| {
                bad("its first subidentifier (40 * first arc + second arc) does not fit in 32 bits")
            })?;
            (first, rest)
        }
        _ => return Err(bad("it has fewer than two arcs")),
    };
    let mut content = Vec::with_capacity(arcs.len() + 4);
    for arc in std::iter::once(first).chain(rest.iter().copied()) {
        let mut groups = [0u8; 5];
        let mut n = 0;
        let mut v = arc;
        loop {
            groups[n] = (v & 0x7f) as u8;
            n += 1;
            v >>= 7;
            if v == 0 {
                break;
            }
        }
        for i in (0..n).rev() {
            content.push(groups[i] | if i > 0 { 0x80 } else { 0 });
        }
    }
    tlv(out, OID, &content);
    Ok(())
}

/// A TLV read from a buffer: its tag, its content and where the content starts in the
/// buffer the reader was made from.
#[derive(Debug, Clone, Copy)]
pub struct Tlv<'a> {
    /// The tag byte.
    pub tag: u8,
    /// The content octets.
    pub content: &'a [u8],
    /// Offset of `content` from the start of the outermost buffer.
    pub offset: usize,
}

impl<'a> Tlv<'a> {
    /// A reader over this TLV's content (for constructed types).
    pub fn reader(&self) -> Reader<'a> {
        Reader {
            buf: self.content,
            pos: 0,
            base: self.offset,
        }
    }

    /// The content as an INTEGER.
    pub fn integer(&self) -> Result<i64, SnmpError> {
        if self.tag != INTEGER {
            return Err(malformed(format!(
                "expected an INTEGER, got tag {:#04x}",
                self.tag
            )));
        }
        if self.content.is_empty() || self.content.len() > 8 {
            return Err(malformed("INTEGER of a bad length"));
        }
        let neg = self.content[0] & 0x80 != 0;
        let mut v: i64 = if neg { -1 } else { 0 };
        for b in self.content {
            v = (v << 8) | i64::from(*b);
        }
        Ok(v)
    }

    /// The content of an OCTET STRING.
    pub fn octets(&self) -> Result<&'a [u8], SnmpError> {
        if self.tag != OCTET_STRING {
            return Err(malformed(format!(
                "expected an OCTET STRING, got tag {:#04x}",
                self.tag
            )));
        }
        Ok(self.content)
    }

    /// The arcs of an OBJECT IDENTIFIER.
    pub fn oid(&self) -> Result<Vec<u32>, SnmpError> {
        if self.tag != OID {
            return Err(malformed(format!(
                "expected an OBJECT IDENTIFIER, got tag {:#04x}",
                self.tag
            )));
        }
        // X.690 8.19.4: at least one subidentifier (the first two arcs).
        if self.content.is_empty() {
            return Err(malformed(
                "an empty OBJECT IDENTIFIER (it needs at least one subidentifier)",
            ));
        }
        let mut arcs = Vec::new();
        let mut v: u32 = 0;
        for (i, b) in self.content.iter().enumerate() {
            if v > (u32::MAX >> 7) {
                return Err(malformed("OBJECT IDENTIFIER arc too large"));
            }
            v = (v << 7) | u32::from(b & 0x7f);
            if b & 0x80 == 0 {
                if arcs.is_empty() {
                    let first = (v / 40).min(2);
                    arcs.push(first);
                    arcs.push(v - first * 40);
                } else {
                    arcs.push(v);
                }
                v = 0;
            } else if i + 1 == self.content.len() {
                return Err(malformed("OBJECT IDENTIFIER ends inside an arc"));
            }
        }
        Ok(arcs)
    }
}

/// Reads TLVs one after another.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    base: usize,
}

impl<'a> Reader<'a> {
    /// A reader over a whole message.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader {
            buf,
            pos: 0,
            base: 0,
        }
    }

    /// Whether everything was read.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    /// The next TLV.
    pub fn read(&mut self) -> Result<Tlv<'a>, SnmpError> {
        let rest = &self.buf[self.pos..];
        let (&tag, rest) = rest
            .split_first()
            .ok_or_else(|| malformed("message ends before a value"))?;
        let (&first, rest) = rest
            .split_first()
            .ok_or_else(|| malformed("message ends inside a length"))?;
        let (len, header) = if first < 0x80 {
            (usize::from(first), 2)
        } else {
            let n = usize::from(first & 0x7f);
            if n == 0 || n > 4 || rest.len() < n {
                return Err(malformed("unsupported or truncated length"));
            }
            let len = rest[..n]
                .iter()
                .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
            (len, 2 + n)
        };
        let start = self.pos + header;
        let end = start
            .checked_add(len)
            .filter(|end| *end <= self.buf.len())
            .ok_or_else(|| malformed("value longer than the message"))?;
        self.pos = end;
        Ok(Tlv {
            tag,
            content: &self.buf[start..end],
            offset: self.base + start,
        })
    }

    /// The next TLV, which must have `tag`.
    pub fn expect(&mut self, tag: u8, what: &str) -> Result<Tlv<'a>, SnmpError> {
        let t = self.read()?;
        if t.tag != tag {
            return Err(malformed(format!(
                "expected {what} (tag {tag:#04x}), got tag {:#04x}",
                t.tag
            )));
        }
        Ok(t)
    }
}

fn malformed(msg: impl Into<String>) -> SnmpError {
    SnmpError::Malformed(msg.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_round_trip_in_shortest_form() {
        for (v, enc) in [
            (0i64, vec![0x02, 1, 0]),
            (127, vec![0x02, 1, 0x7f]),
            (128, vec![0x02, 2, 0, 0x80]),
            (-1, vec![0x02, 1, 0xff]),
            (-129, vec![0x02, 2, 0xff, 0x7f]),
            (65536, vec![0x02, 3, 1, 0, 0]),
        ] {
            let mut out = Vec::new();
            integer(&mut out, v);
            assert_eq!(out, enc, "{v}");
            let t = Reader::new(&out).read().unwrap();
            assert_eq!(t.integer().unwrap(), v);
        }
    }

    #[test]
    fn oids_round_trip() {
        let arcs = [1, 3, 6, 1, 4, 1, 13742, 6, 4, 1, 2, 1, 2, 1, 32];
        let mut out = Vec::new();
        oid(&mut out, &arcs).unwrap();
        assert_eq!(&out[..4], &[0x06, 15, 0x2b, 6]);
        let t = Reader::new(&out).read().unwrap();
        assert_eq!(t.oid().unwrap(), arcs);
        let top = [2, u32::MAX - 80, 1];
        let mut out = Vec::new();
        oid(&mut out, &top).unwrap();
        assert_eq!(Reader::new(&out).read().unwrap().oid().unwrap(), top);
    }

    #[test]
    fn oids_without_an_encoding_are_refused_naming_them() {
        for (arcs, why) in [
            (&[][..], "fewer than two arcs"),
            (&[1][..], "fewer than two arcs"),
            (&[3, 1][..], "first arc"),
            (&[1, 40, 5][..], "second arc"),
            (&[2, u32::MAX - 79, 1][..], "32 bits"),
            (&[u32::MAX, u32::MAX][..], "first arc"),
        ] {
            let mut out = Vec::new();
            let err = oid(&mut out, arcs).unwrap_err().to_string();
            let dotted = arcs
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(".");
            assert!(
                err.contains(why) && err.contains(&dotted),
                "{arcs:?}: {err}"
            );
            assert!(out.is_empty(), "{arcs:?}");
        }
    }

    #[test]
    fn long_lengths_round_trip() {
        let data = vec![7u8; 300];
        let mut out = Vec::new();
        octets(&mut out, &data);
        assert_eq!(&out[..4], &[0x04, 0x82, 0x01, 0x2c]);
        let t = Reader::new(&out).read().unwrap();
        assert_eq!(t.octets().unwrap(), &data[..]);
        assert_eq!(t.offset, 4);
    }

    #[test]
    fn truncated_or_lying_input_is_an_error_not_a_panic() {
        for bad in [
            &[][..],
            &[0x30][..],
            &[0x30, 0x05, 1][..],
            &[0x30, 0x85, 1, 1, 1, 1, 1][..],
            &[0x30, 0x82, 0xff][..],
            &[0x02, 0x00][..],
        ] {
            let mut r = Reader::new(bad);
            let res = r.read().and_then(|t| t.integer().map(|_| ()));
            assert!(res.is_err(), "{bad:?}");
        }
        let t = Reader::new(&[0x06, 2, 0x2b, 0x86]).read().unwrap();
        assert!(t.oid().is_err());
        let t = Reader::new(&[0x06, 0]).read().unwrap();
        assert!(t.oid().is_err());
    }
}
