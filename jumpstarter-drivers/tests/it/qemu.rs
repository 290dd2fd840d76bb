//! The QEMU board's children without booting: flasher (plain, compressed as upstream's
//! client sends it, dump back), bad partitions, the unary methods.

use jumpstarter_core::{
    client::UploadSource,
    driver::DriverArgs,
    wire::resource::{ContentEncoding, encoder},
};
use jumpstarter_drivers::{Progress, Qemu, QemuClient, QemuFlasherClient};
use tokio::io::AsyncWriteExt;

use crate::{Served, storage::random_file};

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
