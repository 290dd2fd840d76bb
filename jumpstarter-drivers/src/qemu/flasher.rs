//! The board's `flasher` child: writes images into the board's partitions and reads them
//! back.

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use jumpstarter_core::{
    CallContext, DriverError, driver,
    wire::resource::{ContentEncoding, ResourceHandle, ResourceStream, decoder},
};
use tokio::io::AsyncWriteExt;

use super::board::Shared;
use crate::storage::Partial;

/// The board's flasher (`jumpstarter_driver_qemu.client.QemuFlasherClient`).
pub struct QemuFlasher {
    shared: Arc<Shared>,
}

#[driver(client = "jumpstarter_driver_qemu.client.QemuFlasherClient")]
impl QemuFlasher {
    /// Writes the client's image (expanded if gzip/xz/bzip2/zstd) to `partition` (`root`
    /// when none). Refused while the board runs.
    #[export]
    async fn flash(
        &self,
        ctx: &CallContext,
        source: serde_json::Value,
        partition: Option<String>,
    ) -> Result<(), DriverError> {
        let handle = resource_handle(source)?;
        let path = self.shared.partition_path(partition.as_deref(), false)?;
        self.refuse_while_running("flash").await?;
        let stream = ctx.resource(&handle)?;
        let timeout = self.shared.settings.flash_timeout;
        let name = partition.as_deref().unwrap_or("root").to_string();
        // Written into a hidden sibling of its own (`.NAME.partial-RANDOM`) and renamed over
        // the partition once complete: a broken, timed out or cancelled transfer leaves the
        // previous image and its sibling is removed (when `partial` is dropped); two flashes
        // at once never write into the same file, the last to complete wins.
        let (partial, file) = Partial::create(&path)
            .await
            .map_err(|e| DriverError::because(format!("flashing {name}"), e))?;
        let written = tokio::time::timeout(timeout, write_expanded(stream, file)).await;
        let n = match written {
            Ok(Ok(n)) => n,
            Ok(Err(e)) => return Err(DriverError::because(format!("flashing {name}"), e)),
            Err(_) => {
                return Err(DriverError::Timeout(format!(
                    "flashing {name}: not done within flash_timeout ({}s)",
                    timeout.as_secs()
                )));
            }
        };
        partial
            .commit(&path)
            .await
            .map_err(|e| DriverError::because(format!("flashing {name}"), e))?;
        ctx.log_info(format!("flashed {n} bytes to {name}"));
        Ok(())
    }

    /// Sends `partition` (`root` when none; a configured default image when never flashed)
    /// into the client's resource.
    #[export]
    async fn dump(
        &self,
        ctx: &CallContext,
        target: serde_json::Value,
        partition: Option<String>,
    ) -> Result<(), DriverError> {
        let handle = resource_handle(target)?;
        let path = self.shared.partition_path(partition.as_deref(), true)?;
        let file = std::fs::File::open(&path).map_err(|e| {
            DriverError::because(
                format!(
                    "dump {}: cannot open {}",
                    partition.as_deref().unwrap_or("root"),
                    path.display()
                ),
                e,
            )
        })?;
        let mut stream = ctx.resource(&handle)?;
        let n = stream
            .copy_from_file(file)
            .await
            .map_err(|e| DriverError::because("dump", e))?;
        stream
            .shutdown()
            .await
            .map_err(|e| DriverError::because("dump", e))?;
        ctx.log_info(format!("dumped {n} bytes"));
        Ok(())
    }
}

impl QemuFlasher {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    async fn refuse_while_running(&self, what: &str) -> Result<(), DriverError> {
        if self.shared.vm.lock().await.is_some() {
            return Err(DriverError::NotReady(format!(
                "{what}: the board is powered on; power it off first"
            )));
        }
        Ok(())
    }
}

/// The resource handle of a `flash`/`dump` argument; `oci://` references are refused.
fn resource_handle(v: serde_json::Value) -> Result<ResourceHandle, DriverError> {
    if let Some(s) = v.as_str() {
        if s.starts_with("oci://") {
            return Err(DriverError::Unimplemented(
                "flashing OCI images (oci://) is not supported by this exporter".into(),
            ));
        }
        return Err(DriverError::InvalidArgument(format!(
            "expected a resource handle, got the string {s:?}"
        )));
    }
    serde_json::from_value(v).map_err(|e| DriverError::invalid_because("not a resource handle", e))
}

/// Writes the stream into `file`, expanding it when its first bytes are a compression
/// format's magic; returns the bytes written.
async fn write_expanded(mut stream: ResourceStream, file: std::fs::File) -> std::io::Result<u64> {
    let Some(first) = stream.chunk().await? else {
        return Ok(0);
    };
    match ContentEncoding::detect(&first) {
        None => {
            let mut f = tokio::fs::File::from_std(file);
            f.write_all(&first).await?;
            f.flush().await?;
            let n = stream.copy_to_file(f.into_std().await).await?;
            Ok(n + first.len() as u64)
        }
        Some(encoding) => {
            // The compressed bytes, first chunk included, as a reader for the decoder.
            let rest = futures::stream::unfold(stream, |mut s| async move {
                match s.chunk().await {
                    Ok(Some(b)) => Some((Ok::<Bytes, std::io::Error>(b), s)),
                    Ok(None) => None,
                    Err(e) => Some((Err(e), s)),
                }
            });
            let all = futures::stream::once(async move { Ok(first) }).chain(rest);
            let reader = tokio_util::io::StreamReader::new(Box::pin(all));
            let mut plain = decoder(
                tokio::io::BufReader::with_capacity(1 << 20, reader),
                Some(encoding),
            );
            let mut f = tokio::fs::File::from_std(file);
            let n = tokio::io::copy(&mut plain, &mut f).await?;
            f.flush().await?;
            Ok(n)
        }
    }
}
