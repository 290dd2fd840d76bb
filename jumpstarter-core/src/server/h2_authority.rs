//! Rewrites unparsable HTTP/2 `:authority` values in a client→server byte stream.
//!
//! Upstream Python clients (grpc C-core) dialling a local Unix socket send the percent-encoded
//! socket path as `:authority` (e.g. `tmp%2Fjumpstarter-abc%2Fsocket`); hyper/h2 rejects that
//! with "malformed authority". The exporter runs every tunnel's inbound bytes through
//! [`AuthorityRewriter`], which replaces such an authority with `localhost`.
//!
//! Every header block is HPACK-decoded (the decoder must see all of them to track the client's
//! dynamic table) and re-encoded without the dynamic table, so the server's table stays empty
//! and the two sides can never disagree. All other frames pass through unchanged.

/// The HTTP/2 client connection preface.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_LEN: usize = 9;
const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// Largest payload emitted per frame: the HTTP/2 default SETTINGS_MAX_FRAME_SIZE, which every
/// server accepts.
const OUT_FRAME_MAX: usize = 16_384;
/// Largest frame payload (or whole header block) accepted: 16 MiB.
pub const MAX_FRAME_LEN: usize = 16 * 1024 * 1024;
/// What replaces an authority that `http::uri::Authority` cannot parse.
const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";

/// Why an HTTP/2 stream could not be rewritten; the connection must be closed.
#[derive(Debug, thiserror::Error)]
pub enum H2AuthorityError {
    /// Reading from the client or writing to the server failed.
    #[error("HTTP/2 authority rewrite: I/O failed")]
    Io(#[from] std::io::Error),
    /// The client did not start with the HTTP/2 connection preface.
    #[error("HTTP/2 authority rewrite: client sent no HTTP/2 connection preface")]
    BadPreface,
    /// A frame payload or header block is larger than [`MAX_FRAME_LEN`].
    #[error("HTTP/2 authority rewrite: {what} of {len} bytes exceeds the {max}-byte limit")]
    TooLarge {
        /// "frame" or "header block".
        what: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Frames violate HTTP/2 framing (padding, interleaving, CONTINUATION order).
    #[error("HTTP/2 authority rewrite: malformed frame from client: {0}")]
    Malformed(&'static str),
    /// A header block failed HPACK decoding.
    #[error("HTTP/2 authority rewrite: bad HPACK header block on stream {stream}: {reason}")]
    Hpack {
        /// The stream the block belongs to.
        stream: u32,
        /// The decoder's complaint.
        reason: String,
    },
}

enum State {
    /// Passing the connection preface through; the count already seen.
    Preface(usize),
    /// Collecting a 9-byte frame header.
    Header,
    /// Forwarding the rest of a non-header frame's payload unchanged.
    PassThrough(usize),
    /// Collecting a HEADERS/CONTINUATION payload of this length.
    HeaderPayload { len: usize },
}

/// An in-progress header block (a HEADERS frame awaiting its CONTINUATIONs).
struct Block {
    stream: u32,
    end_stream: bool,
    fragment: Vec<u8>,
}

/// Incremental transformer of the client→server bytes of one HTTP/2 connection.
pub struct AuthorityRewriter {
    state: State,
    /// Bytes of the current frame header or header-frame payload.
    pending: Vec<u8>,
    frame_header: [u8; FRAME_HEADER_LEN],
    block: Option<Block>,
    decoder: loona_hpack::Decoder<'static>,
    max_len: usize,
}

impl Default for AuthorityRewriter {
    fn default() -> Self {
        Self::new()
    }
}

impl AuthorityRewriter {
    /// A rewriter for a new connection (expects the client preface first).
    pub fn new() -> Self {
        Self::with_max_len(MAX_FRAME_LEN)
    }

    fn with_max_len(max_len: usize) -> Self {
        Self {
            state: State::Preface(0),
            pending: Vec::new(),
            frame_header: [0; FRAME_HEADER_LEN],
            block: None,
            decoder: loona_hpack::Decoder::new(),
            max_len,
        }
    }

    /// Consumes `input` (any split of the stream), appending the bytes to forward to `out`.
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), H2AuthorityError> {
        while !input.is_empty() {
            let (used, run) = self.next_run(input, out)?;
            out.extend_from_slice(&input[used..used + run]);
            input = &input[used + run..];
        }
        Ok(())
    }

    /// Consumes `input` up to the next stretch of frame payload that passes through
    /// unchanged, appending what to forward before it to `out`; then takes that stretch (as
    /// much of it as `input` holds) as forwarded. Returns how much of `input` went to `out`
    /// and the length of the stretch after it, which the caller forwards as it is.
    pub(crate) fn next_run(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(usize, usize), H2AuthorityError> {
        let used = self.feed_until_payload(input, out)?;
        let rest = input.len() - used;
        let run = match self.state {
            State::PassThrough(left) => {
                let n = left.min(rest);
                self.state = if n == left {
                    State::Header
                } else {
                    State::PassThrough(left - n)
                };
                n
            }
            _ => 0,
        };
        if used == 0 && run == 0 && rest > 0 {
            // Cannot happen (the loop below stops only at a payload); never spin on it.
            return Err(H2AuthorityError::Malformed("rewriter made no progress"));
        }
        Ok((used, run))
    }

    /// Consumes `input` until a frame payload that passes through unchanged begins, or to
    /// its end; returns how much it consumed.
    fn feed_until_payload(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<usize, H2AuthorityError> {
        let whole = input.len();
        let mut input = input;
        while !input.is_empty() {
            match self.state {
                State::Preface(seen) => {
                    let n = (PREFACE.len() - seen).min(input.len());
                    if input[..n] != PREFACE[seen..seen + n] {
                        return Err(H2AuthorityError::BadPreface);
                    }
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    self.state = if seen + n == PREFACE.len() {
                        State::Header
                    } else {
                        State::Preface(seen + n)
                    };
                }
                State::Header => {
                    let n = (FRAME_HEADER_LEN - self.pending.len()).min(input.len());
                    self.pending.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    if self.pending.len() == FRAME_HEADER_LEN {
                        self.frame_header.copy_from_slice(&self.pending);
                        self.pending.clear();
                        self.start_frame(out)?;
                    }
                }
                State::PassThrough(_) => break,
                State::HeaderPayload { len } => {
                    let n = (len - self.pending.len()).min(input.len());
                    self.pending.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    if self.pending.len() == len {
                        let payload = std::mem::take(&mut self.pending);
                        self.state = State::Header;
                        self.finish_header_frame(&payload, out)?;
                    }
                }
            }
        }
        Ok(whole - input.len())
    }

    /// Acts on a complete frame header.
    fn start_frame(&mut self, out: &mut Vec<u8>) -> Result<(), H2AuthorityError> {
        let h = self.frame_header;
        let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
        if len > self.max_len {
            return Err(H2AuthorityError::TooLarge {
                what: "frame",
                len,
                max: self.max_len,
            });
        }
        let kind = h[3];
        let is_header = kind == TYPE_HEADERS || kind == TYPE_CONTINUATION;
        if self.block.is_some() && kind != TYPE_CONTINUATION {
            return Err(H2AuthorityError::Malformed(
                "frame interleaved with an unfinished header block",
            ));
        }
        if is_header {
            self.state = State::HeaderPayload { len };
            if len == 0 {
                self.state = State::Header;
                self.finish_header_frame(&[], out)?;
            }
        } else {
            out.extend_from_slice(&h);
            self.state = if len == 0 {
                State::Header
            } else {
                State::PassThrough(len)
            };
        }
        Ok(())
    }

    /// Adds a HEADERS/CONTINUATION payload to the block; emits the block when it ends.
    fn finish_header_frame(
        &mut self,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), H2AuthorityError> {
        let h = self.frame_header;
        let (kind, flags) = (h[3], h[4]);
        let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
        let fragment = if kind == TYPE_HEADERS {
            let mut body = payload;
            let mut pad = 0;
            if flags & FLAG_PADDED != 0 {
                let (&p, rest) = body.split_first().ok_or(H2AuthorityError::Malformed(
                    "PADDED HEADERS without pad length",
                ))?;
                pad = usize::from(p);
                body = rest;
            }
            if flags & FLAG_PRIORITY != 0 {
                body = body.get(5..).ok_or(H2AuthorityError::Malformed(
                    "HEADERS too short for its PRIORITY fields",
                ))?;
            }
            let end = body
                .len()
                .checked_sub(pad)
                .ok_or(H2AuthorityError::Malformed(
                    "HEADERS padding exceeds payload",
                ))?;
            self.block = Some(Block {
                stream,
                end_stream: flags & FLAG_END_STREAM != 0,
                fragment: Vec::new(),
            });
            &body[..end]
        } else {
            match &self.block {
                Some(b) if b.stream == stream => payload,
                _ => {
                    return Err(H2AuthorityError::Malformed(
                        "CONTINUATION without a preceding HEADERS on its stream",
                    ));
                }
            }
        };
        let Some(block) = self.block.as_mut() else {
            return Err(H2AuthorityError::Malformed("header block state lost"));
        };
        if block.fragment.len() + fragment.len() > self.max_len {
            return Err(H2AuthorityError::TooLarge {
                what: "header block",
                len: block.fragment.len() + fragment.len(),
                max: self.max_len,
            });
        }
        block.fragment.extend_from_slice(fragment);
        if flags & FLAG_END_HEADERS != 0
            && let Some(block) = self.block.take()
        {
            self.emit_block(block, out)?;
        }
        Ok(())
    }

    /// Decodes, fixes and re-encodes a complete header block as HEADERS (+ CONTINUATION).
    fn emit_block(&mut self, block: Block, out: &mut Vec<u8>) -> Result<(), H2AuthorityError> {
        let headers =
            self.decoder
                .decode(&block.fragment)
                .map_err(|e| H2AuthorityError::Hpack {
                    stream: block.stream,
                    reason: crate::error_chain(&e),
                })?;
        let mut encoded = Vec::with_capacity(block.fragment.len() + 64);
        for (name, value) in &headers {
            let value: &[u8] = if name == b":authority" && !authority_parses(value) {
                tracing::debug!(
                    "stream {}: replacing unparsable :authority {:?} with localhost",
                    block.stream,
                    String::from_utf8_lossy(value)
                );
                REPLACEMENT_AUTHORITY
            } else {
                value
            };
            encode_literal(name, value, &mut encoded);
        }
        let mut chunks = encoded.chunks(OUT_FRAME_MAX).peekable();
        let mut first = true;
        // An empty block still needs its HEADERS frame.
        let empty: &[u8] = &[];
        let mut next = chunks.next().or(Some(empty));
        while let Some(chunk) = next {
            next = chunks.next();
            let mut flags = 0;
            if next.is_none() {
                flags |= FLAG_END_HEADERS;
            }
            let kind = if first {
                if block.end_stream {
                    flags |= FLAG_END_STREAM;
                }
                TYPE_HEADERS
            } else {
                TYPE_CONTINUATION
            };
            first = false;
            let len = chunk.len();
            out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
            out.extend_from_slice(&block.stream.to_be_bytes());
            out.extend_from_slice(chunk);
        }
        Ok(())
    }
}

fn authority_parses(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// Appends a "literal header field without indexing — new name" (RFC 7541 §6.2.2), raw strings.
fn encode_literal(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0x00);
    encode_string(name, out);
    encode_string(value, out);
}

fn encode_string(s: &[u8], out: &mut Vec<u8>) {
    // 7-bit prefix integer, Huffman bit clear (RFC 7541 §5.1/§5.2).
    let mut n = s.len();
    if n < 127 {
        out.push(n as u8);
    } else {
        out.push(127);
        n -= 127;
        while n >= 128 {
            out.push((n % 128 + 128) as u8);
            n /= 128;
        }
        out.push(n as u8);
    }
    out.extend_from_slice(s);
}

#[cfg(test)]
mod tests {
    use super::*;

    const BAD: &[u8] = b"tmp%2Fjumpstarter-abc%2Fsocket";

    type Headers = Vec<(Vec<u8>, Vec<u8>)>;
    /// (type, flags, stream, payload)
    type Frame = (u8, u8, u32, Vec<u8>);

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn request(authority: &[u8], extra: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        vec![
            (b":method".to_vec(), b"POST".to_vec()),
            (b":scheme".to_vec(), b"http".to_vec()),
            (
                b":path".to_vec(),
                b"/jumpstarter.v1.ExporterService/GetReport".to_vec(),
            ),
            (b":authority".to_vec(), authority.to_vec()),
            (b"content-type".to_vec(), b"application/grpc".to_vec()),
            (b"x-extra".to_vec(), extra.to_vec()),
        ]
    }

    fn encode(enc: &mut loona_hpack::Encoder<'static>, h: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        enc.encode(h.iter().map(|(n, v)| (&n[..], &v[..])))
    }

    /// Splits `bytes` into frames and decodes each complete header block; other frames are
    /// returned as (type, flags, stream, payload).
    fn parse(bytes: &[u8]) -> (Vec<Frame>, Vec<Headers>) {
        assert_eq!(&bytes[..24], PREFACE);
        let mut rest = &bytes[24..];
        let mut frames = Vec::new();
        let mut blocks = Vec::new();
        let mut block = Vec::new();
        while !rest.is_empty() {
            let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            let (kind, flags) = (rest[3], rest[4]);
            let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
            let payload = rest[9..9 + len].to_vec();
            rest = &rest[9 + len..];
            assert!(len <= OUT_FRAME_MAX || (kind != 1 && kind != 9));
            if kind == 1 || kind == 9 {
                block.extend_from_slice(&payload);
                if flags & FLAG_END_HEADERS != 0 {
                    // A fresh decoder per block: the output must not rely on the dynamic table.
                    blocks.push(loona_hpack::Decoder::new().decode(&block).unwrap());
                    block.clear();
                }
            }
            frames.push((kind, flags, stream, payload));
        }
        (frames, blocks)
    }

    fn run(input: &[u8], chunk: usize) -> Result<Vec<u8>, H2AuthorityError> {
        let mut rw = AuthorityRewriter::new();
        let mut out = Vec::new();
        for c in input.chunks(chunk) {
            rw.feed(c, &mut out)?;
        }
        Ok(out)
    }

    #[test]
    fn percent_encoded_authority_is_rejected_by_http_and_good_ones_accepted() {
        assert!(!authority_parses(BAD));
        assert!(authority_parses(b"localhost"));
        assert!(authority_parses(b"127.0.0.1:8082"));
    }

    /// Two requests, the second referring to dynamic-table entries the first inserted (after a
    /// table size update), a DATA frame between them, fed one byte at a time and in odd chunks.
    #[test]
    fn bad_authority_becomes_localhost_and_the_rest_is_intact() {
        let first = request(BAD, b"one");
        let second = request(BAD, b"two");
        // First block: literals with incremental indexing, so the table ends up (newest first)
        // 62 x-extra, 63 content-type, 64 :authority, 65 :path.
        let mut first_block = vec![0x83, 0x86, 0x44];
        encode_string(&first[2].1, &mut first_block);
        first_block.push(0x41);
        encode_string(BAD, &mut first_block);
        first_block.push(0x5f);
        encode_string(b"application/grpc", &mut first_block);
        first_block.push(0x40);
        encode_string(b"x-extra", &mut first_block);
        encode_string(b"one", &mut first_block);
        // Second block: size update to 4096 (keeps entries), then indexed dynamic entries and a
        // literal with the dynamic name 62.
        let mut second_block = vec![0x3f, 0xe1, 0x1f, 0x83, 0x86, 0xc1, 0xc0, 0xbf, 0x0f, 0x2f];
        encode_string(b"two", &mut second_block);
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100])); // SETTINGS
        input.extend(frame(1, FLAG_END_HEADERS, 1, &first_block));
        input.extend(frame(0, FLAG_END_STREAM, 1, b"\0\0\0\0\x05hello"));
        input.extend(frame(
            1,
            FLAG_END_HEADERS | FLAG_END_STREAM,
            3,
            &second_block,
        ));
        for chunk in [1, 7, 1000] {
            let out = run(&input, chunk).unwrap();
            let (frames, blocks) = parse(&out);
            assert_eq!(blocks.len(), 2);
            for (block, want) in blocks.iter().zip([&first, &second]) {
                let mut want = want.clone();
                want[3].1 = b"localhost".to_vec();
                assert_eq!(block, &want);
            }
            let kinds: Vec<_> = frames.iter().map(|f| (f.0, f.1, f.2)).collect();
            assert_eq!(
                kinds,
                [
                    (4, 0, 0),
                    (1, FLAG_END_HEADERS, 1),
                    (0, FLAG_END_STREAM, 1),
                    (1, FLAG_END_HEADERS | FLAG_END_STREAM, 3)
                ]
            );
            assert_eq!(frames[0].3, [0, 3, 0, 0, 0, 100]);
            assert_eq!(frames[2].3, b"\0\0\0\0\x05hello");
        }
    }

    #[test]
    fn good_authority_is_kept_and_padding_priority_stripped() {
        let mut enc = loona_hpack::Encoder::new();
        let h = request(b"127.0.0.1:8082", b"x");
        let block = encode(&mut enc, &h);
        let mut payload = vec![3]; // pad length
        payload.extend_from_slice(&[0x80, 0, 0, 1, 16]); // priority
        payload.extend_from_slice(&block);
        payload.extend_from_slice(&[0, 0, 0]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            1,
            FLAG_END_HEADERS | FLAG_PADDED | FLAG_PRIORITY,
            5,
            &payload,
        ));
        let (frames, blocks) = parse(&run(&input, 3).unwrap());
        assert_eq!(blocks, [h]);
        assert_eq!(frames[0].1, FLAG_END_HEADERS);
    }

    /// A block split over HEADERS + CONTINUATION, and a re-encoded block bigger than one
    /// output frame, which must come out as HEADERS + CONTINUATION.
    #[test]
    fn continuation_in_and_out() {
        let mut enc = loona_hpack::Encoder::new();
        let big = vec![b'v'; 40_000];
        let h = request(BAD, &big);
        let block = encode(&mut enc, &h);
        let (a, rest) = block.split_at(10);
        let (b, c) = rest.split_at(rest.len() / 2);
        let mut input = PREFACE.to_vec();
        input.extend(frame(1, FLAG_END_STREAM, 7, a));
        input.extend(frame(9, 0, 7, b));
        input.extend(frame(9, FLAG_END_HEADERS, 7, c));
        let (frames, blocks) = parse(&run(&input, 4096).unwrap());
        let mut want = h.clone();
        want[3].1 = b"localhost".to_vec();
        assert_eq!(blocks, [want]);
        let kinds: Vec<_> = frames.iter().map(|f| (f.0, f.1, f.2)).collect();
        assert_eq!(
            kinds,
            [(1, FLAG_END_STREAM, 7), (9, 0, 7), (9, FLAG_END_HEADERS, 7)]
        );
    }

    #[test]
    fn oversized_frame_is_rejected() {
        let mut rw = AuthorityRewriter::with_max_len(100);
        let mut input = PREFACE.to_vec();
        input.extend(frame(0, 0, 1, &[0; 101]));
        let mut out = Vec::new();
        let err = rw.feed(&input, &mut out).unwrap_err();
        assert!(
            matches!(
                err,
                H2AuthorityError::TooLarge {
                    what: "frame",
                    len: 101,
                    max: 100
                }
            ),
            "{err}"
        );
        // The real limit: a 24-bit length can never exceed 16 MiB, so one more than the
        // largest is what a smaller limit checks; header blocks accumulate past it.
        let mut rw = AuthorityRewriter::with_max_len(100);
        let mut input = PREFACE.to_vec();
        input.extend(frame(1, 0, 1, &[0x82; 60]));
        input.extend(frame(9, 0, 1, &[0x82; 60]));
        let err = rw.feed(&input, &mut out).unwrap_err();
        assert!(
            matches!(
                err,
                H2AuthorityError::TooLarge {
                    what: "header block",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn bad_input_is_rejected() {
        let mut out = Vec::new();
        assert!(matches!(
            AuthorityRewriter::new().feed(b"GET / HTTP/1.1\r\n", &mut out),
            Err(H2AuthorityError::BadPreface)
        ));
        let cases: Vec<Vec<u8>> = vec![
            frame(9, FLAG_END_HEADERS, 1, &[0x82]), // CONTINUATION alone
            frame(1, FLAG_END_HEADERS | FLAG_PADDED, 1, &[5, 0x82]), // pad > payload
            frame(1, FLAG_END_HEADERS, 1, &[0xff, 0xff]), // bad HPACK index
            [frame(1, 0, 1, &[0x82]), frame(0, 0, 1, b"x")].concat(), // interleaved DATA
        ];
        for case in cases {
            let input = [PREFACE.to_vec(), case].concat();
            let err = AuthorityRewriter::new().feed(&input, &mut out);
            assert!(
                matches!(
                    err,
                    Err(H2AuthorityError::Malformed(_) | H2AuthorityError::Hpack { .. })
                ),
                "{err:?}"
            );
        }
    }
}
