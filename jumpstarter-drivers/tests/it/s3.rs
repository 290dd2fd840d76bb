//! Opendal(s3) against an S3 service on loopback (moto's server, in memory).
//!
//! Built only with the `storage-s3` feature; `cargo xtask ci` runs it with
//! `JMP_TEST_S3_PYTHON` naming a Python that has moto (`cargo xtask s3` alone).

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Read, Write},
    path::Path,
    process::{Child, Command, Stdio},
    sync::Arc,
};

use jumpstarter_core::{ClientError, DriverError, wire::resource::ContentEncoding};
use jumpstarter_drivers::{HashAlgo, Opendal, OpendalClient, PresignedRequest, TransferOptions};

use crate::Served;
use crate::storage::{MIB, compress, cut_opendal_upload, list_sorted, random_file, sha256_of};

const BUCKET: &str = "jmp-test";

/// moto's S3 server with bucket [`BUCKET`]; stopped (stdin closed, then killed) on drop.
struct S3 {
    child: Child,
    endpoint: String,
}

impl S3 {
    fn start() -> Self {
        let python = std::env::var("JMP_TEST_S3_PYTHON").expect(
            "JMP_TEST_S3_PYTHON must name a Python with moto[server] (cargo xtask s3 \
             sets it up)",
        );
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../xtask/interop/moto_s3.py");
        let mut child = Command::new(python)
            .arg(script)
            .arg(BUCKET)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting moto");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let endpoint = line.trim().to_string();
        assert!(
            endpoint.starts_with("http://127.0.0.1:"),
            "moto printed {line:?}"
        );
        Self { child, endpoint }
    }

    /// An Opendal driver on the bucket, every path under `root`.
    fn driver(&self, root: &str) -> Arc<Opendal> {
        let kwargs = BTreeMap::from(
            [
                ("bucket", BUCKET),
                ("endpoint", &self.endpoint),
                ("region", "us-east-1"),
                ("access_key_id", "test"),
                ("secret_access_key", "test"),
                ("root", root),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        Arc::new(Opendal::new("s3", kwargs, false).unwrap())
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends a presigned request with a body over plain HTTP/1.1; returns status and body.
fn send(req: &PresignedRequest, body: &[u8]) -> (u16, Vec<u8>) {
    let rest = req.url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_at(rest.find('/').unwrap());
    assert!(host.starts_with("127.0.0.1:"), "{}", req.url);
    let mut conn = std::net::TcpStream::connect(host).unwrap();
    let mut head = format!(
        "{} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n",
        req.method,
        body.len()
    );
    for (k, v) in &req.headers {
        if !k.eq_ignore_ascii_case("host") {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes()).unwrap();
    conn.write_all(body).unwrap();
    let mut resp = Vec::new();
    conn.read_to_end(&mut resp).unwrap();
    let split = resp.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let status = String::from_utf8_lossy(&resp[9..12]).parse().unwrap();
    (status, resp[split + 4..].to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opendal_s3_round_trip_64mib_and_file_operations() {
    let s3 = S3::start();
    let served = Served::start(vec![("storage", s3.driver("/lab/"))]);
    let c = OpendalClient(served.client().await.driver("storage").unwrap());
    let dir = tempfile::tempdir().unwrap();

    // 64 MiB: more than one part of a multipart upload (S3 refuses parts under 5 MiB
    // but the last).
    let src = dir.path().join("src.img");
    random_file(&src, 64 * MIB, 5);
    c.write_from_path("images/disk.img", &src, &TransferOptions::default())
        .await
        .unwrap();
    let want = sha256_of(&src).await;
    assert_eq!(
        c.stat("images/disk.img").await.unwrap().content_length,
        64 * MIB as u64
    );
    assert_eq!(
        c.hash("images/disk.img", HashAlgo::Sha256).await.unwrap(),
        want.0
    );
    let back = dir.path().join("back.img");
    c.read_into_path("images/disk.img", &back, &TransferOptions::default())
        .await
        .unwrap();
    assert_eq!(sha256_of(&back).await, want);

    // A compressed upload is stored expanded.
    let text = b"compressed on the client, expanded on the exporter\n".repeat(4096);
    let gz = dir.path().join("text.gz");
    std::fs::write(&gz, compress(&text, ContentEncoding::Gzip)).unwrap();
    let opts = TransferOptions {
        encoding: Some(ContentEncoding::Gzip),
        ..TransferOptions::default()
    };
    c.write_from_path("text.txt", &gz, &opts).await.unwrap();
    assert_eq!(c.read_bytes("text.txt").await.unwrap(), text);

    // Objects: copy, rename (S3 has none: unsupported, clearly), list, delete.
    c.copy("text.txt", "copy.txt").await.unwrap();
    assert!(c.exists("copy.txt").await.unwrap());
    let e = c.rename("copy.txt", "moved.txt").await.unwrap_err();
    assert!(
        matches!(&e, ClientError::Call { error: DriverError::Unimplemented(m), .. } if m.contains("rename")),
        "{e}"
    );
    let names = list_sorted(&c, "/", true).await;
    for want in ["copy.txt", "images/disk.img", "text.txt"] {
        assert!(names.contains(&want.to_string()), "{names:?}");
    }
    c.delete("copy.txt").await.unwrap();
    assert!(!c.exists("copy.txt").await.unwrap());
    let e = c.stat("../outside").await.unwrap_err();
    assert!(e.to_string().contains("outside the storage root"), "{e}");

    // Presigned requests work without the exporter in between.
    let cap = c.capability().await.unwrap();
    assert!(cap.presign_read && cap.presign_write, "{cap:?}");
    let put: PresignedRequest = c.0.call("presign_write", ("signed.txt", 60)).await.unwrap();
    assert_eq!(send(&put, b"sent around the exporter").0, 200);
    assert_eq!(
        c.read_bytes("signed.txt").await.unwrap(),
        b"sent around the exporter"
    );
    let get: PresignedRequest = c.0.call("presign_read", ("text.txt", 60)).await.unwrap();
    let (status, body) = send(&get, b"");
    assert_eq!((status, body), (200, text));
}

#[tokio::test]
async fn opendal_s3_cut_upload_stores_nothing() {
    let s3 = S3::start();
    let served = Served::start(vec![("storage", s3.driver("/cut/"))]);
    let c = OpendalClient(served.client().await.driver("storage").unwrap());
    // 10 MiB: more than one part of a multipart upload before the cut.
    cut_opendal_upload(&c, "disk.img", 40).await;
    assert!(!c.exists("disk.img").await.unwrap());
}
