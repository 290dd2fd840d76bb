//! `MockFlasher` served by a real session: flash and dump partitions through the client
//! library and `j`.

use std::sync::Arc;

use jumpstarter_core::wire::resource::ContentEncoding;
use jumpstarter_drivers::{FlasherClient, MockFlasher, Progress, TransferOptions};

use crate::{
    Served,
    storage::{compress, random_file, sha256_of},
};

fn plain() -> TransferOptions {
    TransferOptions::default()
}

// Multi-threaded, as an exporter: expanding a compressed image blocks a worker thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_flash_and_dump_back_identical() {
    let dir = tempfile::tempdir().unwrap();
    let flasher = Arc::new(MockFlasher::new().unwrap());
    let served = Served::start(vec![("flasher", flasher.clone())]);
    let session = served.client().await;
    let c = FlasherClient(session.driver("flasher").unwrap());
    let (img, boot) = (dir.path().join("img"), dir.path().join("boot"));
    random_file(&img, 3 * 1024 * 1024 + 17, 1);
    random_file(&boot, 1000, 2);
    c.flash(&img, None, &plain()).await.unwrap();
    c.flash(&boot, Some("boot"), &plain()).await.unwrap();
    // Each partition is its own file on the exporter.
    assert_eq!(
        sha256_of(&flasher.partition_path("default").unwrap()).await,
        sha256_of(&img).await
    );
    let (out, out_boot) = (dir.path().join("out"), dir.path().join("out-boot"));
    c.dump(&out, None, &plain()).await.unwrap();
    c.dump(&out_boot, Some("boot"), &plain()).await.unwrap();
    assert_eq!(sha256_of(&out).await, sha256_of(&img).await);
    assert_eq!(sha256_of(&out_boot).await, sha256_of(&boot).await);
    // A compressed image arrives expanded.
    let data = std::fs::read(&boot).unwrap();
    let gz = dir.path().join("boot.gz");
    std::fs::write(&gz, compress(&data, ContentEncoding::Gzip)).unwrap();
    let opts = TransferOptions {
        encoding: Some(ContentEncoding::Gzip),
        progress: Progress::hidden(),
    };
    c.flash(&gz, Some("rootfs"), &opts).await.unwrap();
    assert_eq!(
        std::fs::read(flasher.partition_path("rootfs").unwrap()).unwrap(),
        data
    );
}

#[test]
fn upstream_type_names_are_registered() {
    let r = jumpstarter_drivers::stock_registry();
    let types: Vec<&str> = r.types().collect();
    for t in [
        "jumpstarter_driver_opendal.driver.MockFlasher",
        "jumpstarter_driver_shell.driver.Shell",
    ] {
        assert!(types.contains(&t), "{t} not registered");
    }
}

#[tokio::test]
async fn bad_partitions_and_sources_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let served = Served::start(vec![("flasher", Arc::new(MockFlasher::new().unwrap()))]);
    let session = served.client().await;
    let c = FlasherClient(session.driver("flasher").unwrap());
    let img = dir.path().join("img");
    random_file(&img, 100, 3);
    let e = c
        .flash(&img, Some("../escape"), &plain())
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("invalid partition \"../escape\""),
        "{e}"
    );
    assert!(!dir.path().join("escape").exists());
    let out = dir.path().join("out");
    let e = c.dump(&out, Some("never"), &plain()).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("partition \"never\" was never flashed"),
        "{e}"
    );
    assert!(!out.exists(), "a failed dump left a file");
    // A URL nothing answers at: the exporter's fetch fails, naming it.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let e = c
        .flash(
            std::path::Path::new(&format!("http://{dead}/img")),
            None,
            &plain(),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("cannot connect"), "{e}");
    // The flasher still works.
    c.flash(&img, None, &plain()).await.unwrap();
}

#[tokio::test]
async fn j_flash_with_targets_and_dump() {
    let dir = tempfile::tempdir().unwrap();
    let flasher = Arc::new(MockFlasher::new().unwrap());
    let served = Served::start(vec![("flasher", flasher.clone())]);
    let session = served.client().await;
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    random_file(&a, 5000, 4);
    random_file(&b, 6000, 5);
    let run = |args: Vec<String>| {
        let session = &session;
        async move {
            let m = jumpstarter_drivers::j_command(session)
                .await
                .try_get_matches_from(args)
                .unwrap();
            jumpstarter_drivers::run_j_command(session.root(), m).await
        }
    };
    let s = |p: &std::path::Path| p.to_string_lossy().into_owned();
    run(vec![
        "j".into(),
        "flasher".into(),
        "flash".into(),
        "-t".into(),
        format!("boot:{}", s(&a)),
        "-t".into(),
        format!("root:{}", s(&b)),
    ])
    .await
    .unwrap();
    assert_eq!(
        std::fs::read(flasher.partition_path("boot").unwrap()).unwrap(),
        std::fs::read(&a).unwrap()
    );
    let out = dir.path().join("out");
    run(vec![
        "j".into(),
        "flasher".into(),
        "dump".into(),
        s(&out),
        "--target".into(),
        "root".into(),
    ])
    .await
    .unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&b).unwrap());
    let e = run(vec![
        "j".into(),
        "flasher".into(),
        "flash".into(),
        "-t".into(),
        "nocolon".into(),
    ])
    .await
    .unwrap_err();
    assert!(
        e.to_string().contains("Invalid target spec 'nocolon'"),
        "{e}"
    );
    let e = run(vec!["j".into(), "flasher".into(), "flash".into()])
        .await
        .unwrap_err();
    assert!(e.to_string().contains("FILE argument is required"), "{e}");
}
