//! Resource streams: bytes a client sends to (or receives from) a driver, passed by handle.
//!
//! The client opens `RouterService.Stream` on the session with a `resource` request; the
//! exporter registers one end of an in-memory pipe under a fresh uuid and answers with the
//! handle in the initial metadata. The client then passes the handle as an ordinary
//! driver-call argument, and the driver opens it with [`crate::CallContext::resource`].

use std::{
    collections::HashMap,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf, ReadHalf, WriteHalf};
use uuid::Uuid;

use crate::DriverError;

/// Size of the in-memory pipe between a resource stream and its driver: the amount of data
/// in flight per direction before the sender waits (backpressure).
pub const PIPE_BUFFER: usize = 256 * 1024;

/// A content encoding negotiated for a resource stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContentEncoding {
    /// gzip
    Gzip,
    /// xz
    Xz,
    /// bzip2
    Bz2,
    /// zstd
    Zstd,
}

/// The handle a driver method receives for a resource (the `resource` argument upstream).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ResourceHandle {
    /// Bytes streamed by the client over `RouterService.Stream`.
    ClientStream {
        /// The resource uuid the exporter assigned.
        uuid: Uuid,
        /// The encoding of the bytes the client sends, if any.
        #[serde(default)]
        x_jmp_content_encoding: Option<ContentEncoding>,
    },
    /// A URL the exporter fetches (or uploads to) itself.
    PresignedRequest {
        /// Request headers.
        #[serde(default)]
        headers: HashMap<String, String>,
        /// The URL.
        url: String,
        /// `GET` or `PUT`.
        method: String,
    },
}

/// The request a client puts in the `request` metadata of `RouterService.Stream`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StreamRequestMetadata {
    /// Open an `#[export(stream)]` method of a driver.
    Driver {
        /// The driver uuid.
        uuid: Uuid,
        /// The method name.
        method: String,
    },
    /// Open a resource stream for a driver.
    Resource {
        /// The driver uuid.
        uuid: Uuid,
        /// The encoding the client would like to send in.
        #[serde(default)]
        x_jmp_content_encoding: Option<ContentEncoding>,
    },
}

impl StreamRequestMetadata {
    /// The exact compact JSON the upstream client emits (field order matters to no one, but
    /// we keep it identical to be safe).
    pub fn to_json(&self) -> String {
        match self {
            StreamRequestMetadata::Driver { uuid, method } => serde_json::json!({
                "kind": "driver", "uuid": uuid, "method": method
            })
            .to_string(),
            StreamRequestMetadata::Resource {
                uuid,
                x_jmp_content_encoding,
            } => format!(
                "{{\"kind\":\"resource\",\"uuid\":\"{uuid}\",\"x_jmp_content_encoding\":{}}}",
                serde_json::to_string(x_jmp_content_encoding).unwrap_or_else(|_| "null".into())
            ),
        }
    }
}

/// The driver's end of a resource stream: read the client's bytes, write bytes back
/// (shut down the writer to signal the end).
pub struct ResourceStream {
    read: Pin<Box<dyn AsyncRead + Send>>,
    write: WriteHalf<DuplexStream>,
}

impl ResourceStream {
    /// Wraps the driver's end of the pipe.
    pub(crate) fn new(end: DuplexStream) -> Self {
        let (r, w): (ReadHalf<DuplexStream>, WriteHalf<DuplexStream>) = tokio::io::split(end);
        Self {
            read: Box::pin(r),
            write: w,
        }
    }
}

impl AsyncRead for ResourceStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.read.as_mut().poll_read(cx, buf)
    }
}

impl AsyncWrite for ResourceStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.write).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.write).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.write).poll_shutdown(cx)
    }
}

/// The open resource streams of a session, by uuid.
#[derive(Default)]
pub struct ResourceRegistry {
    pending: Mutex<HashMap<Uuid, DuplexStream>>,
}

impl ResourceRegistry {
    /// Registers a new resource; returns its uuid and the session's end of the pipe.
    pub(crate) fn create(self: &Arc<Self>) -> (Uuid, DuplexStream, ResourceGuard) {
        let (session_end, driver_end) = tokio::io::duplex(PIPE_BUFFER);
        let uuid = Uuid::new_v4();
        self.lock().insert(uuid, driver_end);
        let guard = ResourceGuard {
            registry: self.clone(),
            uuid,
        };
        (uuid, session_end, guard)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, DuplexStream>> {
        // A poisoned lock only means another call panicked while holding it; the map itself
        // is always consistent (single insert/remove operations).
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the driver's end of a resource stream.
    pub fn open(&self, handle: &ResourceHandle) -> Result<ResourceStream, DriverError> {
        match handle {
            ResourceHandle::ClientStream {
                uuid,
                x_jmp_content_encoding,
            } => {
                if let Some(enc) = x_jmp_content_encoding {
                    // The exporter never accepts an encoding it cannot decode, so a handle
                    // claiming one was not negotiated with this session.
                    return Err(DriverError::InvalidArgument(format!(
                        "resource {uuid}: content encoding {enc:?} was not negotiated"
                    )));
                }
                let end = self.lock().remove(uuid).ok_or_else(|| {
                    DriverError::InvalidArgument(format!(
                        "unknown resource {uuid}: no open stream with that handle (closed or already used)"
                    ))
                })?;
                Ok(ResourceStream::new(end))
            }
            ResourceHandle::PresignedRequest { url, .. } => Err(DriverError::Unimplemented(
                format!("presigned requests are not supported by this exporter ({url})"),
            )),
        }
    }
}

/// Removes a resource from the registry when its stream RPC ends.
pub(crate) struct ResourceGuard {
    registry: Arc<ResourceRegistry>,
    uuid: Uuid,
}

impl Drop for ResourceGuard {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.uuid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_metadata_is_upstream_compact_json() {
        let u = Uuid::nil();
        let r = StreamRequestMetadata::Resource {
            uuid: u,
            x_jmp_content_encoding: None,
        };
        assert_eq!(
            r.to_json(),
            r#"{"kind":"resource","uuid":"00000000-0000-0000-0000-000000000000","x_jmp_content_encoding":null}"#
        );
        let parsed: StreamRequestMetadata = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(parsed, r);
        let d: StreamRequestMetadata = serde_json::from_str(
            r#"{"method":"connect","uuid":"00000000-0000-0000-0000-000000000000","kind":"driver"}"#,
        )
        .unwrap();
        assert!(matches!(d, StreamRequestMetadata::Driver { .. }));
    }

    #[test]
    fn handle_opens_once() {
        let reg = Arc::new(ResourceRegistry::default());
        let (uuid, _end, _guard) = reg.create();
        let h = ResourceHandle::ClientStream {
            uuid,
            x_jmp_content_encoding: None,
        };
        assert!(reg.open(&h).is_ok());
        let again = reg.open(&h).err().unwrap();
        assert!(again.to_string().contains("unknown resource"), "{again}");
    }

    #[test]
    fn guard_removes_unused_resource() {
        let reg = Arc::new(ResourceRegistry::default());
        let (uuid, _end, guard) = reg.create();
        drop(guard);
        let h = ResourceHandle::ClientStream {
            uuid,
            x_jmp_content_encoding: None,
        };
        assert!(reg.open(&h).is_err());
    }
}
