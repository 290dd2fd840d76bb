//! The QEMU board's children without booting: flasher (plain, compressed as upstream's
//! client sends it, dump back), bad partitions, the unary methods.

use std::sync::Arc;

use jumpstarter_core::{
    CallContext, DriverError,
    client::UploadSource,
    driver,
    driver::DriverArgs,
    wire::resource::{ContentEncoding, ResourceHandle, encoder},
};
use jumpstarter_drivers::{Progress, Qemu, QemuClient, QemuFlasherClient};
use tokio::io::AsyncWriteExt;

use crate::{
    Served,
    storage::{MIB, random_file},
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flasher_writes_expands_and_dumps_partitions() {
    let board = Qemu::from_args(&DriverArgs {
        config: serde_json::json!({"hostname": "b1", "mem": "256M"}),
    })
    .unwrap();
    let served = Served::start(vec![("board", board)]);
    let session = served.client().await;
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.img");
    random_file(&image, 3 * 1024 * 1024 + 17, 7);

    let flasher = QemuFlasherClient(session.driver("board.flasher").unwrap());
    flasher
        .flash(&image, None, &Progress::hidden())
        .await
        .unwrap();
    let back = dir.path().join("back.img");
    flasher
        .dump(&back, Some("root"), &Progress::hidden())
        .await
        .unwrap();
    assert!(std::fs::read(&back).unwrap() == std::fs::read(&image).unwrap());

    // A gzip image sent as it is (as upstream's client does) is expanded on the exporter.
    let gz = dir.path().join("bios.gz");
    let mut w = encoder(
        tokio::fs::File::create(&gz).await.unwrap(),
        Some(ContentEncoding::Gzip),
    );
    w.write_all(b"firmware bytes").await.unwrap();
    w.shutdown().await.unwrap();
    let raw = flasher.0.clone();
    let client = flasher.0.clone();
    raw.upload(
        UploadSource::file(std::fs::File::open(&gz).unwrap()),
        None,
        |h| async move { client.call::<serde_json::Value>("flash", (h, "bios")).await },
    )
    .await
    .unwrap();
    let bios = dir.path().join("bios.out");
    flasher
        .dump(&bios, Some("bios"), &Progress::hidden())
        .await
        .unwrap();
    assert_eq!(std::fs::read(&bios).unwrap(), b"firmware bytes");

    let e = flasher
        .flash(&image, Some("boot"), &Progress::hidden())
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("invalid partition name: boot"),
        "{e}"
    );
    let e = flasher
        .dump(&back, Some("OVMF_CODE.fd"), &Progress::hidden())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("OVMF_CODE.fd"), "{e}");

    let q = QemuClient(session.driver("board").unwrap());
    assert_eq!(q.hostname().await.unwrap(), "b1");
    assert_eq!(q.username().await.unwrap(), "jumpstarter");
    assert_eq!(q.password().await.unwrap(), "password");
    q.set_memory_size("1G").await.unwrap();
    let e = q.set_disk_size("huge").await.unwrap_err();
    assert!(e.to_string().contains("invalid size"), "{e}");
}

/// A QEMU flasher whose `dump` sends part of the image, then fails (a read error midway).
struct BrokenDump;

#[driver(client = "jumpstarter_driver_qemu.client.QemuFlasherClient")]
impl BrokenDump {
    #[export]
    async fn dump(
        &self,
        ctx: &CallContext,
        target: ResourceHandle,
        _partition: Option<String>,
    ) -> Result<(), DriverError> {
        let mut s = ctx.resource(&target)?;
        s.write_all(&vec![7u8; 512 * 1024]).await?;
        Err(DriverError::failed("disk image unreadable at sector 1024"))
    }
}

fn files_in(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A dump that fails midway leaves nothing at the destination (no truncated file that
/// looks like an image), and a file that was there keeps its content; a dump refused by
/// the exporter does not touch it either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_dump_leaves_no_partial_file() {
    let dir = tempfile::tempdir().unwrap();
    let served = Served::start(vec![("flasher", Arc::new(BrokenDump))]);
    let session = served.client().await;
    let flasher = QemuFlasherClient(session.driver("flasher").unwrap());
    let out = dir.path().join("disk.img");
    let e = flasher
        .dump(&out, None, &Progress::hidden())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("sector 1024"), "{e}");
    assert!(
        files_in(dir.path()).is_empty(),
        "{:?}",
        files_in(dir.path())
    );

    std::fs::write(&out, b"the previous dump").unwrap();
    let e = flasher
        .dump(&out, Some("root"), &Progress::hidden())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("sector 1024"), "{e}");
    assert_eq!(std::fs::read(&out).unwrap(), b"the previous dump");
    assert_eq!(files_in(dir.path()), ["disk.img"]);

    // The real board: a partition never flashed (and with no default image) is refused.
    let board = Qemu::from_args(&DriverArgs {
        config: serde_json::json!({"mem": "256M"}),
    })
    .unwrap();
    let served = Served::start(vec![("board", board)]);
    let session = served.client().await;
    let flasher = QemuFlasherClient(session.driver("board.flasher").unwrap());
    assert!(
        flasher
            .dump(&out, Some("bios"), &Progress::hidden())
            .await
            .is_err()
    );
    assert_eq!(std::fs::read(&out).unwrap(), b"the previous dump");
    assert_eq!(files_in(dir.path()), ["disk.img"]);
}

/// Two flashes of one partition at once: each writes into a file of its own, so the
/// partition ends up holding one whole image (the last to complete), never a mix of both,
/// and neither fails because of the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_flashes_never_mix_their_images() {
    let board = Qemu::from_args(&DriverArgs {
        config: serde_json::json!({"mem": "256M"}),
    })
    .unwrap();
    let served = Served::start(vec![("board", board)]);
    let session = served.client().await;
    let flasher = QemuFlasherClient(session.driver("board.flasher").unwrap());
    let dir = tempfile::tempdir().unwrap();

    // A slow flash: its first MiB now, its second once the other flash is done.
    let (tx, rx) = futures::channel::mpsc::unbounded::<std::io::Result<bytes::Bytes>>();
    let raw = flasher.0.clone();
    let slow = tokio::spawn(async move {
        let client = raw.clone();
        raw.upload(UploadSource::chunks(rx), None, |h| async move {
            client.call::<serde_json::Value>("flash", (h, "root")).await
        })
        .await
    });
    tx.unbounded_send(Ok(vec![0xaa; MIB].into())).unwrap();
    // Time for the exporter to take that first MiB (and open the file it writes into).
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let other = dir.path().join("other.img");
    random_file(&other, 3 * MIB, 9);
    flasher
        .flash(&other, None, &Progress::hidden())
        .await
        .unwrap();
    tx.unbounded_send(Ok(vec![0xbb; MIB].into())).unwrap();
    drop(tx);
    slow.await.unwrap().unwrap();

    let back = dir.path().join("back.img");
    flasher
        .dump(&back, None, &Progress::hidden())
        .await
        .unwrap();
    let got = std::fs::read(&back).unwrap();
    let slow_image = [vec![0xaa; MIB], vec![0xbb; MIB]].concat();
    assert!(
        got == slow_image,
        "the partition holds {} bytes that are not the last image flashed",
        got.len()
    );
}
