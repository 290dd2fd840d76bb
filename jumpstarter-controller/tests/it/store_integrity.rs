//! Issue 22 item 6: a missing or emptied store beside existing keys, and a damaged store,
//! are refused at start with what to do.

use jumpstarter_controller::{
    ControllerConfig, LabelSelector,
    objects::{Client, ClientSpec},
    start,
    store::{ListParams, Store},
};

async fn seeded(data: &std::path::Path, clients: usize) {
    let ctl = start(ControllerConfig::loopback(data.to_path_buf()))
        .await
        .unwrap();
    for i in 0..clients {
        let mut c = Client::new(&format!("client-{i:04}"), ClientSpec::default());
        c.metadata.namespace = Some("default".into());
        c.metadata.labels = Some([("padding".to_string(), "x".repeat(60))].into());
        ctl.state.store.create(&c).await.unwrap();
    }
    ctl.shutdown().await;
}

#[tokio::test]
async fn a_missing_or_emptied_store_beside_keys_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    seeded(&data, 1).await;
    let db = data.join("store.db");
    for emptied in [false, true] {
        for f in ["store.db", "store.db-wal", "store.db-shm"] {
            let _ = std::fs::remove_file(data.join(f));
        }
        if emptied {
            std::fs::write(&db, b"").unwrap();
        }
        let e = match start(ControllerConfig::loopback(data.clone())).await {
            Ok(_) => panic!("started without its store (emptied: {emptied})"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("missing or empty"), "{e}");
        assert!(e.contains(&db.display().to_string()), "{e}");
        assert!(e.contains("restore"), "{e}");
        assert!(e.contains("--accept-empty-store"), "{e}");
    }
    // On purpose: starts empty.
    let ctl = start(ControllerConfig {
        accept_empty_store: true,
        ..ControllerConfig::loopback(data.clone())
    })
    .await
    .unwrap();
    let clients = ctl
        .state
        .store
        .list::<Client>(None, &LabelSelector::everything(), &ListParams::default())
        .await;
    ctl.shutdown().await;
    assert!(clients.map(|l| l.items.is_empty()).unwrap_or(true));
}

#[tokio::test]
async fn a_damaged_store_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    seeded(&data, 400).await;
    let db = data.join("store.db");
    let mut bytes = std::fs::read(&db).unwrap();
    assert!(
        bytes.len() > 32 * 1024,
        "store too small to damage: {}",
        bytes.len()
    );
    // 8 KiB of pseudo-random bytes in the middle.
    let mid = bytes.len() / 2;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for b in &mut bytes[mid..mid + 8192] {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    std::fs::write(&db, &bytes).unwrap();
    let e = match start(ControllerConfig::loopback(data.clone())).await {
        Ok(_) => panic!("started on a damaged store"),
        Err(e) => jumpstarter_core::error_chain(&e),
    };
    assert!(e.contains("damaged") || e.contains("malformed"), "{e}");
    assert!(e.contains("restore"), "{e}");
}
