//! `RouterService.Stream` spoken straight over HTTP/2, without tonic's message codec.
//!
//! Bulk data (flashing an image) crosses this RPC as `{payload, frame_type}` messages.
//! tonic's codec copies every message twice on the way: once into its encode buffer when
//! sending, once into its decode buffer when receiving (plus the buffer's regrowth). Here
//! a message goes out as two HTTP/2 DATA chunks, its few header bytes and the payload
//! itself, and is decoded from the HTTP/2 frames it arrived in, its payload a slice of
//! one of them (a copy only when a payload itself straddles frames). The bytes on the wire are ordinary gRPC: length-prefixed
//! protobuf messages, `grpc-status` in the trailers, so any gRPC peer (upstream's Python
//! tools, our router) sees no difference.

use std::{
    collections::VecDeque,
    pin::Pin,
    task::{Context, Poll, ready},
};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::Stream;
use http::{HeaderMap, HeaderValue};
use http_body::{Body as HttpBody, Frame as BodyFrame};
use tonic::{Code, Status, body::Body};

/// The HTTP/2 path of the RPC.
pub const STREAM_PATH: &str = "/jumpstarter.v1.RouterService/Stream";

/// The largest message accepted, as gRPC's default receive limit.
pub const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// A `StreamRequest` / `StreamResponse` reduced to what is encoded.
pub trait RawFrame: Send + 'static {
    /// The payload and the frame type number.
    fn into_raw(self) -> (Bytes, i32);
    /// A frame of `frame_type` carrying `payload`.
    fn from_raw(payload: Bytes, frame_type: i32) -> Self;
}

/// The number of the DATA frame type.
const DATA: i32 = jumpstarter_proto::v1::FrameType::Data as i32;

macro_rules! impl_raw_frame {
    ($t:ty) => {
        impl RawFrame for $t {
            fn into_raw(self) -> (Bytes, i32) {
                (self.payload, self.frame_type)
            }
            fn from_raw(payload: Bytes, frame_type: i32) -> Self {
                Self {
                    payload,
                    frame_type,
                }
            }
        }
    };
}
impl_raw_frame!(jumpstarter_proto::v1::StreamRequest);
impl_raw_frame!(jumpstarter_proto::v1::StreamResponse);

fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

/// The gRPC length prefix and the protobuf field headers of a message whose payload
/// follows them on the wire: `frame_type` (field 2) first, then the payload's key and
/// length (field 1). Protobuf readers accept fields in any order; default values (an
/// empty payload, frame type 0) are left out as proto3 encoders do.
pub fn message_head(payload_len: usize, frame_type: i32) -> Bytes {
    // Negative enum values are encoded as ten-byte varints, as protobuf does for int32.
    let ft = frame_type as i64 as u64;
    let ft_len = if frame_type != 0 {
        1 + varint_len(ft)
    } else {
        0
    };
    let payload_head = if payload_len > 0 {
        1 + varint_len(payload_len as u64)
    } else {
        0
    };
    let len = ft_len + payload_head + payload_len;
    let mut head = BytesMut::with_capacity(5 + ft_len + payload_head);
    head.put_u8(0);
    head.put_u32(len as u32);
    if frame_type != 0 {
        head.put_u8(0x10);
        prost::encoding::encode_varint(ft, &mut head);
    }
    if payload_len > 0 {
        head.put_u8(0x0a);
        prost::encoding::encode_varint(payload_len as u64, &mut head);
    }
    head.freeze()
}

/// Which end of the RPC a body belongs to: a server's response ends with trailers
/// carrying `grpc-status`; a client's request just ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The caller (request body out, response body in).
    Client,
    /// The callee (request body in, response body out).
    Server,
}

/// An outgoing body made of the frames `S` yields.
///
/// On the server side the end of `S` becomes `grpc-status: 0` trailers and an error
/// becomes the error's status in the trailers; on the client side the body just ends, or
/// fails with the error (which resets the HTTP/2 stream).
pub struct FrameBody<S> {
    frames: S,
    side: Side,
    payload: Option<Bytes>,
    done: bool,
}

impl<S> FrameBody<S> {
    /// Encodes `frames` for `side`.
    pub fn new(frames: S, side: Side) -> Self {
        Self {
            frames,
            side,
            payload: None,
            done: false,
        }
    }
}

fn status_trailers(status: &Status) -> HeaderMap {
    let mut trailers = HeaderMap::new();
    if status.add_header(&mut trailers).is_err() {
        // A message that cannot be a header value: keep the code.
        trailers.insert(Status::GRPC_STATUS, HeaderValue::from(status.code() as i32));
    }
    trailers
}

impl<S, F> HttpBody for FrameBody<S>
where
    S: Stream<Item = Result<F, Status>> + Unpin,
    F: RawFrame,
{
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<BodyFrame<Bytes>, Status>>> {
        let this = &mut *self;
        if let Some(payload) = this.payload.take() {
            return Poll::Ready(Some(Ok(BodyFrame::data(payload))));
        }
        if this.done {
            return Poll::Ready(None);
        }
        let item = ready!(Pin::new(&mut this.frames).poll_next(cx));
        match item {
            Some(Ok(frame)) => {
                let (payload, frame_type) = frame.into_raw();
                let head = message_head(payload.len(), frame_type);
                if !payload.is_empty() {
                    this.payload = Some(payload);
                }
                Poll::Ready(Some(Ok(BodyFrame::data(head))))
            }
            Some(Err(status)) => {
                this.done = true;
                match this.side {
                    Side::Server => {
                        Poll::Ready(Some(Ok(BodyFrame::trailers(status_trailers(&status)))))
                    }
                    Side::Client => Poll::Ready(Some(Err(status))),
                }
            }
            None => {
                this.done = true;
                match this.side {
                    Side::Server => Poll::Ready(Some(Ok(BodyFrame::trailers(status_trailers(
                        &Status::ok(""),
                    ))))),
                    Side::Client => Poll::Ready(None),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.payload.is_none()
    }
}

/// The status a peer's headers or trailers carry, if any (`grpc-status-details-bin` is
/// ignored: tonic would panic on a malformed one).
pub fn status_from_headers(headers: &HeaderMap) -> Option<Status> {
    headers.get(Status::GRPC_STATUS)?;
    let mut headers = headers.clone();
    headers.remove(Status::GRPC_STATUS_DETAILS);
    Status::from_header_map(&headers)
}

/// The frames of an incoming body, decoded as they arrive.
///
/// Payloads are slices of the HTTP/2 frames they came in, never copies: a DATA message
/// whose payload straddles frames (as when the sender ran out of flow-control window
/// midway) comes out as one DATA frame per piece, which carries the same bytes, since
/// DATA payloads make up a byte stream. On the client side the end of the body must carry
/// `grpc-status` trailers (an error status is yielded as an error, a missing one is a
/// broken stream); on the server side the request body simply ends.
pub struct FrameDecoder<B, F> {
    body: B,
    side: Side,
    buffered: Gathered,
    /// The length of the message being gathered, once its prefix has been read.
    want: Option<usize>,
    /// Frames decoded and not yet yielded (the pieces of a straddling DATA message).
    ready: VecDeque<F>,
    done: bool,
}

// Frames are never pinned: they are only moved in and out of `ready`.
impl<B: Unpin, F> Unpin for FrameDecoder<B, F> {}

impl<B, F> FrameDecoder<B, F> {
    /// Decodes `body` for `side`.
    pub fn new(body: B, side: Side) -> Self {
        Self {
            body,
            side,
            buffered: Gathered::default(),
            want: None,
            ready: VecDeque::new(),
            done: false,
        }
    }

    /// The next whole message, if buffered.
    fn next_message(&mut self) -> Result<Option<Gathered>, Status> {
        if self.want.is_none() {
            if self.buffered.remaining() < 5 {
                return Ok(None);
            }
            let mut prefix = self.buffered.split_to(5);
            if prefix.get_u8() != 0 {
                return Err(Status::unimplemented(
                    "compressed gRPC messages are not supported on this stream",
                ));
            }
            let len = prefix.get_u32() as usize;
            if len > MAX_MESSAGE {
                return Err(Status::resource_exhausted(format!(
                    "stream message of {len} bytes, over the {MAX_MESSAGE}-byte limit"
                )));
            }
            self.want = Some(len);
        }
        match self.want {
            Some(len) if self.buffered.remaining() >= len => {
                self.want = None;
                Ok(Some(self.buffered.split_to(len)))
            }
            _ => Ok(None),
        }
    }
}

/// Decodes a `StreamRequest` / `StreamResponse` message: its frame type and its payload,
/// left in the pieces it arrived in. Fields may come in any order and repeat (the last
/// wins), unknown fields are skipped, as protobuf readers do.
fn decode_message(mut msg: Gathered) -> Result<(i32, Gathered), String> {
    use prost::encoding::{DecodeContext, WireType, decode_key, decode_varint, skip_field};
    let mut frame_type = 0;
    let mut payload = Gathered::default();
    while msg.has_remaining() {
        let (tag, wire_type) = decode_key(&mut msg).map_err(|e| crate::error_chain(&e))?;
        match (tag, wire_type) {
            (1, WireType::LengthDelimited) => {
                let len = decode_varint(&mut msg).map_err(|e| crate::error_chain(&e))?;
                if len > msg.remaining() as u64 {
                    return Err(format!(
                        "payload of {len} bytes in a message with {} left",
                        msg.remaining()
                    ));
                }
                payload = msg.split_to(len as usize);
            }
            // int32 (an enum) is read as protobuf does: the varint's low 32 bits.
            (2, WireType::Varint) => {
                frame_type = decode_varint(&mut msg).map_err(|e| crate::error_chain(&e))? as i32;
            }
            (1 | 2, _) => return Err(format!("field {tag} with wire type {wire_type:?}")),
            _ => skip_field(wire_type, tag, &mut msg, DecodeContext::default())
                .map_err(|e| crate::error_chain(&e))?,
        }
    }
    Ok((frame_type, payload))
}

/// Pieces smaller than this are glued to a small piece before them (see [`Gathered::push`]).
const SMALL: usize = 4096;

/// Bytes as the HTTP/2 frames brought them, in order: the decoder's buffer, and the bytes
/// of one message. A sender such as ours puts a message's few header bytes and its payload
/// in separate frames, so a message nearly always straddles two; decoding reads across the
/// pieces, and takes a payload as slices of them rather than a copy.
#[derive(Debug, Default)]
struct Gathered {
    parts: VecDeque<Bytes>,
    remaining: usize,
}

impl Gathered {
    /// Appends a piece (empty ones are dropped).
    ///
    /// Small pieces that follow one another are glued together (copied) up to [`SMALL`]
    /// bytes, so that a peer sending a flood of tiny HTTP/2 frames cannot make the queue of
    /// pieces, or the frames decoded from it, grow long: there is at most one piece per
    /// [`SMALL`] bytes, plus one per piece that is big on its own.
    fn push(&mut self, part: Bytes) {
        if part.is_empty() {
            return;
        }
        self.remaining += part.len();
        if part.len() < SMALL
            && let Some(last) = self.parts.pop_back()
        {
            if last.len() < SMALL {
                let mut glued = match last.try_into_mut() {
                    Ok(own) => own,
                    Err(shared) => {
                        let mut own = BytesMut::with_capacity(2 * SMALL);
                        own.extend_from_slice(&shared);
                        own
                    }
                };
                glued.extend_from_slice(&part);
                self.parts.push_back(glued.freeze());
                return;
            }
            self.parts.push_back(last);
        }
        self.parts.push_back(part);
    }

    /// Takes the first `n` bytes (at most all there are) as the pieces they are in.
    fn split_to(&mut self, n: usize) -> Gathered {
        let mut out = Gathered::default();
        while out.remaining < n {
            let Some(mut part) = self.parts.pop_front() else {
                break;
            };
            let need = n - out.remaining;
            if part.len() > need {
                out.push(part.split_to(need));
                self.parts.push_front(part);
            } else {
                out.push(part);
            }
        }
        self.remaining -= out.remaining;
        out
    }
}

impl Buf for Gathered {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.parts.front().map_or(&[], |part| part.as_ref())
    }

    fn advance(&mut self, mut cnt: usize) {
        while cnt > 0 {
            let Some(front) = self.parts.front_mut() else {
                break;
            };
            let step = cnt.min(front.len());
            front.advance(step);
            self.remaining -= step;
            cnt -= step;
            if front.is_empty() {
                self.parts.pop_front();
            }
        }
    }

    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        let len = len.min(self.remaining);
        if let Some(front) = self.parts.front_mut()
            && front.len() >= len
        {
            let out = front.split_to(len);
            self.remaining -= len;
            if front.is_empty() {
                self.parts.pop_front();
            }
            return out;
        }
        let mut out = BytesMut::with_capacity(len);
        out.put(Buf::take(&mut *self, len));
        out.freeze()
    }
}

impl<B, F> Stream for FrameDecoder<B, F>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    F: RawFrame,
{
    type Item = Result<F, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(frame) = this.ready.pop_front() {
                return Poll::Ready(Some(Ok(frame)));
            }
            if this.done {
                return Poll::Ready(None);
            }
            match this.next_message() {
                Ok(Some(message)) => match decode_message(message) {
                    Ok((frame_type, mut payload)) => {
                        if frame_type == DATA && payload.parts.len() > 1 {
                            this.ready.extend(
                                payload
                                    .parts
                                    .into_iter()
                                    .map(|p| F::from_raw(p, frame_type)),
                            );
                            continue;
                        }
                        let len = payload.remaining();
                        return Poll::Ready(Some(Ok(F::from_raw(
                            payload.copy_to_bytes(len),
                            frame_type,
                        ))));
                    }
                    Err(e) => {
                        this.done = true;
                        return Poll::Ready(Some(Err(Status::internal(format!(
                            "undecodable stream message: {e}"
                        )))));
                    }
                },
                Ok(None) => {}
                Err(status) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(status)));
                }
            }
            let frame = ready!(Pin::new(&mut this.body).poll_frame(cx));
            match frame {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => this.buffered.push(data),
                    Err(frame) => {
                        let Ok(trailers) = frame.into_trailers() else {
                            continue;
                        };
                        this.done = true;
                        if let Some(status) = this.end_status(Some(&trailers)) {
                            return Poll::Ready(Some(Err(status)));
                        }
                        return Poll::Ready(None);
                    }
                },
                Some(Err(e)) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(Status::from_error(e.into()))));
                }
                None => {
                    this.done = true;
                    if let Some(status) = this.end_status(None) {
                        return Poll::Ready(Some(Err(status)));
                    }
                    return Poll::Ready(None);
                }
            }
        }
    }
}

impl<B, F> FrameDecoder<B, F> {
    /// What the end of the body means: `None` for a clean end, else the error to yield.
    fn end_status(&self, trailers: Option<&HeaderMap>) -> Option<Status> {
        if self.buffered.has_remaining() || self.want.is_some() {
            return Some(Status::internal("the stream ended inside a message"));
        }
        match (self.side, trailers.and_then(status_from_headers)) {
            (_, Some(status)) if status.code() != Code::Ok => Some(status),
            (_, Some(_)) | (Side::Server, None) => None,
            (Side::Client, None) => Some(Status::internal(
                "the stream ended without a grpc-status (protocol error)",
            )),
        }
    }
}

/// Refuses a request this module cannot serve: another method than [`STREAM_PATH`], or
/// compressed messages.
pub fn check_request<B>(req: &http::Request<B>) -> Result<(), Status> {
    if req.uri().path() != STREAM_PATH {
        return Err(Status::unimplemented(format!(
            "unknown method {}",
            req.uri().path()
        )));
    }
    if let Some(enc) = req.headers().get("grpc-encoding")
        && enc.as_bytes() != b"identity"
    {
        return Err(Status::unimplemented(format!(
            "message compression {enc:?} is not supported on RouterService.Stream"
        )));
    }
    Ok(())
}

/// The frames of a response, as [`call`] returns them.
pub type ResponseFrames = FrameDecoder<Body, jumpstarter_proto::v1::StreamResponse>;

/// Calls the RPC on `channel` (any gRPC client service: a tonic channel, with or without
/// interceptors): `frames` become the request body as they come, `metadata` is added to
/// the request headers. Returns the response's headers and frames once the peer answers,
/// or the status it refused the call with (a "trailers-only" answer, or an HTTP error).
pub async fn call<C, B, S>(
    channel: C,
    metadata: HeaderMap,
    frames: S,
) -> Result<(HeaderMap, ResponseFrames), Status>
where
    C: tower::Service<http::Request<Body>, Response = http::Response<B>>,
    C::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S: Stream<Item = jumpstarter_proto::v1::StreamRequest> + Send + Unpin + 'static,
{
    use futures::StreamExt;
    let body = Body::new(FrameBody::new(frames.map(Ok::<_, Status>), Side::Client));
    let mut req = http::Request::new(body);
    *req.method_mut() = http::Method::POST;
    *req.uri_mut() = http::Uri::from_static(STREAM_PATH);
    *req.headers_mut() = metadata;
    let headers = req.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
    let resp = tower::ServiceExt::oneshot(channel, req)
        .await
        .map_err(|e| Status::from_error(e.into()))?;
    let (parts, body) = resp.into_parts();
    // A "trailers-only" answer carries its status in the headers and has no messages.
    let side = match status_from_headers(&parts.headers) {
        Some(status) if status.code() != Code::Ok => return Err(status),
        Some(_) => Side::Server,
        None if parts.status != http::StatusCode::OK => {
            return Err(Status::unavailable(format!(
                "the peer answered HTTP {}",
                parts.status
            )));
        }
        None => Side::Client,
    };
    Ok((parts.headers, FrameDecoder::new(Body::new(body), side)))
}

/// A response carrying `frames`, with `headers` (gRPC metadata) added.
pub fn response<S, F>(frames: S, headers: HeaderMap) -> http::Response<Body>
where
    S: Stream<Item = Result<F, Status>> + Send + Unpin + 'static,
    F: RawFrame,
{
    let mut response = http::Response::new(Body::new(FrameBody::new(frames, Side::Server)));
    *response.headers_mut() = headers;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use jumpstarter_proto::v1::{FrameType, StreamRequest};
    use prost::Message;

    fn req(payload: &[u8], ft: FrameType) -> StreamRequest {
        StreamRequest {
            payload: Bytes::copy_from_slice(payload),
            frame_type: ft as i32,
        }
    }

    /// Encodes like tonic would (prost, then the gRPC prefix).
    fn grpc(msg: &StreamRequest) -> Vec<u8> {
        let body = msg.encode_to_vec();
        let mut out = vec![0];
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    async fn encode_all(frames: Vec<StreamRequest>, side: Side) -> (Vec<u8>, Option<HeaderMap>) {
        let body = FrameBody::new(
            futures::stream::iter(frames.into_iter().map(Ok::<_, Status>)),
            side,
        );
        let mut body = std::pin::pin!(body);
        let (mut bytes, mut trailers) = (Vec::new(), None);
        while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            match frame.unwrap().into_data() {
                Ok(d) => bytes.extend_from_slice(&d),
                Err(f) => trailers = f.into_trailers().ok(),
            }
        }
        (bytes, trailers)
    }

    #[tokio::test]
    async fn encoded_messages_read_back_with_prost() {
        let frames = vec![
            req(b"hello", FrameType::Data),
            req(&[7u8; 300], FrameType::Data),
            req(b"", FrameType::Goaway),
            req(b"x", FrameType::RstStream),
        ];
        let (bytes, trailers) = encode_all(frames.clone(), Side::Server).await;
        let mut rest = &bytes[..];
        for want in &frames {
            let len = u32::from_be_bytes(rest[1..5].try_into().unwrap()) as usize;
            assert_eq!(rest[0], 0);
            let got = StreamRequest::decode(&rest[5..5 + len]).unwrap();
            assert_eq!(&got, want);
            rest = &rest[5 + len..];
        }
        assert!(rest.is_empty());
        let trailers = trailers.unwrap();
        assert_eq!(trailers.get("grpc-status").unwrap(), "0");
        let (_, none) = encode_all(frames, Side::Client).await;
        assert!(none.is_none(), "a client's request body has no trailers");
    }

    fn body_of(chunks: Vec<Vec<u8>>, trailers: Option<HeaderMap>) -> Body {
        let mut frames: Vec<Result<BodyFrame<Bytes>, Status>> = chunks
            .into_iter()
            .map(|c| Ok(BodyFrame::data(Bytes::from(c))))
            .collect();
        if let Some(t) = trailers {
            frames.push(Ok(BodyFrame::trailers(t)));
        }
        Body::new(http_body_util::StreamBody::new(futures::stream::iter(
            frames,
        )))
    }

    fn ok_trailers() -> HeaderMap {
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("0"));
        t
    }

    async fn decode_all(body: Body, side: Side) -> Vec<Result<StreamRequest, Status>> {
        FrameDecoder::<_, StreamRequest>::new(body, side)
            .collect()
            .await
    }

    #[tokio::test]
    async fn messages_split_anyhow_across_frames_decode() {
        let frames = [
            req(b"hello", FrameType::Data),
            req(&[9u8; 1000], FrameType::Data),
            req(b"", FrameType::Goaway),
        ];
        let wire: Vec<u8> = frames.iter().flat_map(grpc).collect();
        // DATA messages cut across frames may come out in pieces: same bytes, same order.
        let want = merge_data(frames.to_vec());
        for cut in [1, 3, 5, 7, 64, 999, wire.len()] {
            let chunks = wire.chunks(cut).map(<[u8]>::to_vec).collect();
            let got = decode_all(body_of(chunks, Some(ok_trailers())), Side::Client).await;
            let got: Vec<_> = got.into_iter().map(Result::unwrap).collect();
            assert!(
                got.iter()
                    .all(|f| !f.payload.is_empty() || f.frame_type != 0)
            );
            assert_eq!(merge_data(got), want, "chunks of {cut}");
        }
        let whole = decode_all(body_of(vec![wire], Some(ok_trailers())), Side::Client).await;
        let whole: Vec<_> = whole.into_iter().map(Result::unwrap).collect();
        assert_eq!(whole, frames, "one frame, one message each");
    }

    /// Joins the payloads of consecutive DATA frames.
    fn merge_data(frames: Vec<StreamRequest>) -> Vec<StreamRequest> {
        let mut out: Vec<StreamRequest> = Vec::new();
        for f in frames {
            match out.last_mut() {
                Some(last) if last.frame_type == 0 && f.frame_type == 0 => {
                    let mut joined = last.payload.to_vec();
                    joined.extend_from_slice(&f.payload);
                    last.payload = joined.into();
                }
                _ => out.push(f),
            }
        }
        out
    }

    fn decode_blocking(chunks: Vec<Vec<u8>>) -> Vec<Result<StreamRequest, Status>> {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(decode_all(body_of(chunks, None), Side::Server))
    }

    /// Cuts `wire` at the given points (taken modulo its length).
    fn cut(wire: &[u8], points: &[usize]) -> Vec<Vec<u8>> {
        let mut at: Vec<usize> = points.iter().map(|p| p % (wire.len() + 1)).collect();
        at.push(0);
        at.push(wire.len());
        at.sort_unstable();
        at.windows(2).map(|w| wire[w[0]..w[1]].to_vec()).collect()
    }

    proptest::proptest! {
        // The fuzz targets' knob of the case count (`JUMPSTARTER_FUZZ_CASES`).
        #![proptest_config(crate::fuzz_tests::fuzz_config())]

        #[test]
        fn any_frames_cut_anywhere_decode_to_the_same_stream(
            frames in proptest::collection::vec(
                (proptest::collection::vec(proptest::num::u8::ANY, 0..600),
                 proptest::sample::select(vec![0, 3, 6, 7, 42, -5]),
                 proptest::bool::ANY),
                0..8),
            points in proptest::collection::vec(0usize..10_000, 0..12),
        ) {
            let mut wire = Vec::new();
            let mut want = Vec::new();
            for (payload, ft, ours) in frames {
                let msg = StreamRequest { payload: payload.into(), frame_type: ft };
                if ours {
                    wire.extend_from_slice(&message_head(msg.payload.len(), ft));
                    wire.extend_from_slice(&msg.payload);
                } else {
                    wire.extend_from_slice(&grpc(&msg));
                }
                want.push(msg);
            }
            let got: Vec<_> = decode_blocking(cut(&wire, &points))
                .into_iter()
                .collect::<Result<_, _>>()
                .map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?;
            proptest::prop_assert_eq!(merge_data(got), merge_data(want));
        }

        #[test]
        fn garbage_never_panics_and_an_error_ends_the_stream(
            wire in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
            points in proptest::collection::vec(0usize..300, 0..6),
        ) {
            let got = decode_blocking(cut(&wire, &points));
            if let Some(i) = got.iter().position(Result::is_err) {
                proptest::prop_assert_eq!(i, got.len() - 1, "frames after an error");
            }
        }
    }

    #[tokio::test]
    async fn a_straddling_data_payload_comes_out_in_its_pieces_uncopied() {
        let payload = Bytes::from((0..=255u8).cycle().take(100_000).collect::<Vec<u8>>());
        let mut wire = message_head(payload.len(), FrameType::Data as i32).to_vec();
        wire.extend_from_slice(&payload);
        let wire = Bytes::from(wire);
        // Cut as a sender out of flow-control window would: inside the payload.
        let (a, b) = (wire.slice(..40_000), wire.slice(40_000..));
        let frames: Vec<Result<BodyFrame<Bytes>, Status>> = vec![
            Ok(BodyFrame::data(a.clone())),
            Ok(BodyFrame::data(b.clone())),
            Ok(BodyFrame::trailers(ok_trailers())),
        ];
        let body = Body::new(http_body_util::StreamBody::new(futures::stream::iter(
            frames,
        )));
        let got: Vec<_> = decode_all(body, Side::Client)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(got.len(), 2);
        assert!(got.iter().all(|f| f.frame_type == FrameType::Data as i32));
        assert_eq!([&got[0].payload[..], &got[1].payload[..]].concat(), payload);
        let head = wire.len() - payload.len();
        assert_eq!(got[0].payload.as_ptr(), a[head..].as_ptr(), "copied");
        assert_eq!(got[1].payload.as_ptr(), b.as_ptr(), "copied");

        // Another frame type is never split: its payload is copied whole.
        let msg = req(&payload, FrameType::Goaway);
        let wire = grpc(&msg);
        let chunks = vec![wire[..40_000].to_vec(), wire[40_000..].to_vec()];
        let got = decode_all(body_of(chunks, None), Side::Server).await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].as_ref().unwrap(), &msg);
    }

    #[test]
    fn messages_decode_as_prost_reads_them() {
        use prost::encoding::{WireType, encode_key, encode_varint};
        let mut cases: Vec<Vec<u8>> = Vec::new();
        // Payload after the frame type (ours), before it (prost's and Python's order).
        cases.push(
            message_head(3, 7)[5..]
                .iter()
                .chain(b"abc")
                .copied()
                .collect(),
        );
        cases.push(req(b"abc", FrameType::Goaway).encode_to_vec());
        // Repeated fields (the last wins), unknown fields of each wire type, negative type.
        let mut m = Vec::new();
        encode_key(1, WireType::LengthDelimited, &mut m);
        encode_varint(2, &mut m);
        m.extend_from_slice(b"xy");
        encode_key(9, WireType::Varint, &mut m);
        encode_varint(300, &mut m);
        encode_key(10, WireType::ThirtyTwoBit, &mut m);
        m.extend_from_slice(&[1, 2, 3, 4]);
        encode_key(11, WireType::SixtyFourBit, &mut m);
        m.extend_from_slice(&[0; 8]);
        encode_key(12, WireType::LengthDelimited, &mut m);
        encode_varint(1, &mut m);
        m.push(0);
        encode_key(1, WireType::LengthDelimited, &mut m);
        encode_varint(1, &mut m);
        m.push(b'z');
        encode_key(2, WireType::Varint, &mut m);
        encode_varint(-1i64 as u64, &mut m);
        cases.push(m);
        cases.push(Vec::new());
        for case in cases {
            let want = StreamRequest::decode(&case[..]).unwrap();
            // Cut anywhere: the same message.
            for cut in 0..=case.len() {
                let mut g = Gathered::default();
                g.push(Bytes::copy_from_slice(&case[..cut]));
                g.push(Bytes::copy_from_slice(&case[cut..]));
                let (ft, mut payload) = decode_message(g).unwrap();
                let len = payload.remaining();
                let got = StreamRequest::from_raw(payload.copy_to_bytes(len), ft);
                assert_eq!(got, want, "{case:?} cut at {cut}");
            }
        }
        // What prost refuses, refused too.
        let bad: [&[u8]; 5] = [
            &[0x0a, 5, b'a'], // payload longer than the message
            &[0x10],          // varint cut short
            &[0x08, 1],       // field 1 as a varint
            &[0x12, 1, 0],    // field 2 length-delimited
            &[0x0b, 0x0c],    // a group (deprecated wire type) left open
        ];
        for case in bad {
            assert!(StreamRequest::decode(case).is_err(), "prost takes {case:?}");
            let mut g = Gathered::default();
            g.push(Bytes::from_static(case));
            assert!(decode_message(g).is_err(), "{case:?}");
        }
    }

    #[tokio::test]
    async fn bad_and_cut_bodies_are_errors() {
        let one = grpc(&req(b"hello", FrameType::Data));
        // Client side: no grpc-status at the end.
        let got = decode_all(body_of(vec![one.clone()], None), Side::Client).await;
        assert!(got[0].is_ok());
        assert!(
            got[1]
                .as_ref()
                .unwrap_err()
                .message()
                .contains("grpc-status")
        );
        // Server side: a request body just ends.
        let got = decode_all(body_of(vec![one.clone()], None), Side::Server).await;
        assert_eq!(got.len(), 1);
        // Cut inside a message.
        let got = decode_all(body_of(vec![one[..8].to_vec()], None), Side::Server).await;
        assert!(
            got[0]
                .as_ref()
                .unwrap_err()
                .message()
                .contains("inside a message")
        );
        // An error status in the trailers.
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("10"));
        t.insert("grpc-message", HeaderValue::from_static("gone"));
        let got = decode_all(body_of(vec![one.clone()], Some(t)), Side::Client).await;
        let e = got[1].as_ref().unwrap_err();
        assert_eq!((e.code(), e.message()), (Code::Aborted, "gone"));
        // Malformed details never panic.
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("13"));
        t.insert(
            "grpc-status-details-bin",
            HeaderValue::from_static("!!not base64!!"),
        );
        let got = decode_all(body_of(vec![], Some(t)), Side::Client).await;
        assert_eq!(got[0].as_ref().unwrap_err().code(), Code::Internal);
        // Compressed flag, oversized length, garbage protobuf.
        let mut compressed = one.clone();
        compressed[0] = 1;
        let got = decode_all(body_of(vec![compressed], None), Side::Server).await;
        assert_eq!(got[0].as_ref().unwrap_err().code(), Code::Unimplemented);
        let mut huge = vec![0u8];
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        let got = decode_all(body_of(vec![huge], None), Side::Server).await;
        assert_eq!(got[0].as_ref().unwrap_err().code(), Code::ResourceExhausted);
        let got = decode_all(
            body_of(vec![vec![0, 0, 0, 0, 2, 0xff, 0xff]], None),
            Side::Server,
        )
        .await;
        assert!(
            got[0]
                .as_ref()
                .unwrap_err()
                .message()
                .contains("undecodable")
        );
        assert_eq!(got.len(), 1, "nothing after an error");
    }

    #[tokio::test]
    async fn payloads_come_out_as_slices_of_the_frames_they_came_in() {
        // As our sender puts them on the wire: the message head, then the payload.
        let payload = Bytes::from(vec![5u8; 256 * 1024]);
        let head = message_head(payload.len(), FrameType::Data as i32);
        let frames: Vec<Result<BodyFrame<Bytes>, Status>> = vec![
            Ok(BodyFrame::data(head)),
            Ok(BodyFrame::data(payload.clone())),
            Ok(BodyFrame::trailers(ok_trailers())),
        ];
        let body = Body::new(http_body_util::StreamBody::new(futures::stream::iter(
            frames,
        )));
        let got = decode_all(body, Side::Client).await;
        let got = got[0].as_ref().unwrap();
        assert_eq!(got.payload, payload);
        assert_eq!(
            got.payload.as_ptr(),
            payload.as_ptr(),
            "the payload was copied"
        );
    }

    #[test]
    fn a_flood_of_tiny_pieces_is_glued_into_a_few() {
        let mut g = Gathered::default();
        let big = Bytes::from(vec![7u8; 10_000]);
        let mut want = Vec::new();
        for i in 0..20_000u32 {
            let tiny = Bytes::from(vec![(i % 251) as u8]);
            want.extend_from_slice(&tiny);
            g.push(tiny);
            if i == 10_000 {
                want.extend_from_slice(&big);
                g.push(big.clone());
            }
        }
        assert_eq!(g.remaining(), want.len());
        assert!(g.parts.len() <= 12, "{} pieces", g.parts.len());
        assert!(
            g.parts.iter().any(|p| p.as_ptr() == big.as_ptr()),
            "big piece copied"
        );
        let all = g.copy_to_bytes(want.len());
        assert_eq!(&all[..], &want[..]);
    }

    #[test]
    fn gathered_parts_read_across_their_boundaries() {
        let mut g = Gathered {
            parts: [&b"ab"[..], b"cde", b"f"]
                .into_iter()
                .map(Bytes::from_static)
                .collect(),
            remaining: 6,
        };
        assert_eq!(g.copy_to_bytes(1), Bytes::from_static(b"a"));
        assert_eq!(g.copy_to_bytes(3), Bytes::from_static(b"bcd"));
        g.advance(1);
        assert_eq!(g.chunk(), b"f");
        assert_eq!(g.copy_to_bytes(9), Bytes::from_static(b"f"), "clamped");
        assert_eq!((g.remaining(), g.chunk()), (0, &b""[..]));
        g.advance(3);
        assert_eq!(g.remaining(), 0);
    }

    #[test]
    fn heads_match_prost_for_odd_values() {
        for (len, ft) in [(0, 0), (1, 0), (127, 7), (128, 3), (300_000, 6), (5, -1)] {
            let msg = StreamRequest {
                payload: Bytes::from(vec![1u8; len]),
                frame_type: ft,
            };
            let mut ours = message_head(len, ft).to_vec();
            ours.extend_from_slice(&msg.payload);
            assert_eq!(StreamRequest::decode(&ours[5..]).unwrap(), msg);
            assert_eq!(ours.len() - 5, msg.encoded_len(), "len {len} ft {ft}");
        }
    }
}
