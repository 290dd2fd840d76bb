//! Flashing and writing from HTTP(S) URLs the client passes (the exporter fetches them,
//! against a real loopback HTTP server), and the boot servers `HttpServer` and `Tftp`
//! tested with real clients (curl, tftp-hpa).

use std::{
    path::Path,
    process::{Command, Stdio},
    sync::Arc,
    time::Duration,
};

use futures::StreamExt;
use jumpstarter_core::{
    client::{ConnectOptions, connect_channel},
    driver::DriverArgs,
};
use jumpstarter_drivers::{
    FlasherClient, HttpServer, HttpServerClient, MockFlasher, MockStorageMuxFlasher, OpendalClient,
    Presign, StorageMuxClient, Tftp, TftpServerClient, TransferOptions,
};
use jumpstarter_proto::v1::exporter_service_client::ExporterServiceClient;
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::TcpListener,
};

use crate::{Served, storage::random_file};

/// Whether an external tool is installed. Missing under `CI=true` is a failure naming it
/// (`cargo xtask ci` installs it); elsewhere the test is skipped with a note.
fn have_tool(tool: &str, package: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{tool} is missing (Debian package {package}; cargo xtask ci installs it)"
        );
        eprintln!("skipping: {tool} is not installed (apt-get install {package})");
    }
    found
}

/// A loopback HTTP/1.1 server serving `body` at a percent-encoded path, a redirect to it
/// and 404 for anything else; returns its base URL.
async fn image_server(body: Vec<u8>) -> (String, tokio::task::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    let body = Arc::new(body);
    let task = tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = l.accept().await else {
                return;
            };
            let body = body.clone();
            tokio::spawn(async move {
                let mut r = BufReader::new(sock);
                let mut line = String::new();
                r.read_line(&mut line).await.unwrap();
                let target = line
                    .split_whitespace()
                    .nth(1)
                    .unwrap_or_default()
                    .to_string();
                loop {
                    let mut h = String::new();
                    if r.read_line(&mut h).await.unwrap() == 0 || h == "\r\n" {
                        break;
                    }
                }
                let mut sock = r.into_inner();
                let head = match target.as_str() {
                    "/images/disk%20image%2B1.raw?sig=a%2Fb" => format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
                        body.len()
                    ),
                    "/latest" => "HTTP/1.1 302 Found\r\nLocation: /images/disk%20image%2B1.raw?sig=a%2Fb\r\nContent-Length: 0\r\n\r\n".into(),
                    _ => "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".into(),
                };
                let _ = sock.write_all(head.as_bytes()).await;
                if head.starts_with("HTTP/1.1 200") {
                    for c in body.chunks(64 * 1024) {
                        if sock.write_all(c).await.is_err() {
                            return;
                        }
                    }
                }
                let _ = sock.shutdown().await;
            });
        }
    });
    (base, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flash_from_a_url_follows_redirects_keeps_encoding_and_logs_progress() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("img");
    random_file(&img, 2 * 1024 * 1024 + 5, 11);
    let data = std::fs::read(&img).unwrap();
    let (base, server) = image_server(data.clone()).await;

    let flasher = Arc::new(MockFlasher::new().unwrap());
    let served = Served::start(vec![("flasher", flasher.clone())]);
    let channel = connect_channel(&served.socket.to_string_lossy(), &ConnectOptions::default())
        .await
        .unwrap();
    let mut logs = ExporterServiceClient::new(channel)
        .log_stream(())
        .await
        .unwrap()
        .into_inner();
    let session = served.client().await;
    let c = FlasherClient(session.driver("flasher").unwrap());
    let url = format!("{base}/latest");
    c.flash(Path::new(&url), None, &TransferOptions::default())
        .await
        .unwrap();
    assert!(std::fs::read(flasher.partition_path("default").unwrap()).unwrap() == data);
    // The client sees the exporter's progress in its LogStream.
    let mut seen = Vec::new();
    while !seen.iter().any(|m: &String| m.contains("downloaded")) {
        let rec = tokio::time::timeout(Duration::from_secs(10), logs.next())
            .await
            .expect("a progress record")
            .unwrap()
            .unwrap();
        seen.push(rec.message);
    }
    let last = seen.last().unwrap();
    assert!(
        last.contains(&format!("({} bytes)", data.len())),
        "{seen:?}"
    );
    assert!(!last.contains("a%2Fb"), "the query is redacted: {last}");

    // A 404 fails the flash with the status, and the exporter goes on.
    let e = c
        .flash(
            Path::new(&format!("{base}/nothing.img")),
            Some("p2"),
            &TransferOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("404"), "{e}");
    // A dump cannot go to a URL: refused, not taken for a file name.
    let e = c
        .dump(Path::new(&url), None, &TransferOptions::default())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("cannot dump to a URL"), "{e}");
    // Compression cannot apply to a URL: refused before anything is sent.
    let opts = TransferOptions {
        encoding: Some(jumpstarter_core::wire::resource::ContentEncoding::Gzip),
        ..TransferOptions::default()
    };
    let e = c.flash(Path::new(&url), None, &opts).await.unwrap_err();
    assert!(
        e.to_string().contains("not supported with an http(s) URL"),
        "{e}"
    );
    c.flash(&img, Some("p3"), &TransferOptions::default())
        .await
        .unwrap();
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_writes_and_mux_flashes_from_a_url() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..300_000u32).flat_map(|i| i.to_be_bytes()).collect();
    let (base, server) = image_server(data.clone()).await;
    let url = format!("{base}/latest");

    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let storage = jumpstarter_drivers::Opendal::new(
        "fs",
        [("root".to_string(), root.display().to_string())].into(),
        false,
    )
    .unwrap();
    let mux = MockStorageMuxFlasher::from_args(&DriverArgs {
        config: serde_json::json!({}),
    })
    .unwrap();
    let served = Served::start(vec![("storage", Arc::new(storage)), ("mux", mux)]);
    let session = served.client().await;
    let s = OpendalClient(session.driver("storage").unwrap());
    s.write_from_path("boot/img.raw", Path::new(&url), &TransferOptions::default())
        .await
        .unwrap();
    assert!(std::fs::read(root.join("boot/img.raw")).unwrap() == data);
    let e = s
        .write_from_path(
            "bad.raw",
            Path::new(&format!("{base}/x")),
            &TransferOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("404"), "{e}");
    assert!(
        !root.join("bad.raw").exists(),
        "a failed fetch stored a file"
    );

    let m = StorageMuxClient(session.driver("mux").unwrap());
    m.flash(Path::new(&url), &TransferOptions::default(), false)
        .await
        .unwrap();
    let back = dir.path().join("back");
    m.dump(&back, &TransferOptions::default()).await.unwrap();
    assert!(std::fs::read(&back).unwrap() == data);
    let e = m
        .flash(Path::new(&url), &TransferOptions::default(), true)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("cannot verify against a URL"), "{e}");
    server.abort();
}

#[tokio::test]
async fn storage_bytes_and_presign_commands() {
    let dir = tempfile::tempdir().unwrap();
    let storage = jumpstarter_drivers::Opendal::new(
        "fs",
        [("root".to_string(), dir.path().display().to_string())].into(),
        false,
    )
    .unwrap();
    let served = Served::start(vec![("storage", Arc::new(storage))]);
    let session = served.client().await;
    let s = OpendalClient(session.driver("storage").unwrap());
    s.write_bytes("a/b.txt", b"content".to_vec()).await.unwrap();
    assert_eq!(s.read_bytes("a/b.txt").await.unwrap(), b"content");
    // The fs service cannot presign: a clear error, from the typed client and from `j`.
    let e = s.presign(Presign::Read, "a/b.txt", 60).await.unwrap_err();
    assert!(e.to_string().contains("presign"), "{e}");
    let cmd = jumpstarter_drivers::j_command(&session).await;
    for sub in ["presign-stat", "presign-read", "presign-write"] {
        let m = cmd
            .clone()
            .try_get_matches_from(["j", "storage", sub, "a/b.txt", "--expire-second", "5"])
            .unwrap();
        let e = jumpstarter_drivers::run_j_command(session.root(), m)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("presign"), "{sub}: {e}");
        // --expire-second is required, as upstream.
        assert!(
            cmd.clone()
                .try_get_matches_from(["j", "storage", sub, "a/b.txt"])
                .is_err()
        );
    }
    for sub in ["write-bytes", "read-bytes"] {
        assert!(
            cmd.clone()
                .try_get_matches_from(["j", "storage", sub, "a/b.txt"])
                .is_ok(),
            "{sub}"
        );
    }
}

fn boot_server_args(root: &Path, port: u16) -> DriverArgs {
    DriverArgs {
        config: serde_json::json!({
            "root_dir": root.display().to_string(),
            "host": "127.0.0.1",
            "port": port,
        }),
    }
}

fn curl(args: &[&str]) -> (bool, Vec<u8>) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "60"])
        .args(args)
        .output()
        .unwrap();
    (out.status.success(), out.stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_server_serves_what_its_storage_child_writes() {
    if !have_tool("curl", "curl") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("www");
    let http = HttpServer::from_args(&boot_server_args(&root, 0)).unwrap();
    let served = Served::start(vec![("http", http)]);
    let session = served.client().await;
    let c = HttpServerClient(session.driver("http").unwrap());
    assert_eq!(c.get_port().await.unwrap(), 0);
    c.start().await.unwrap();
    let url = c.get_url().await.unwrap();
    assert_eq!(c.get_host().await.unwrap(), "127.0.0.1");
    assert_eq!(
        url,
        format!("http://127.0.0.1:{}", c.get_port().await.unwrap())
    );

    let kernel = dir.path().join("vmlinuz");
    random_file(&kernel, 5 * 1024 * 1024 + 3, 21);
    let file_url = c
        .put_file("boot/vmlinuz", &kernel, &TransferOptions::default())
        .await
        .unwrap();
    assert_eq!(file_url, format!("{url}/boot/vmlinuz"));
    let (ok, body) = curl(&[&file_url]);
    assert!(ok && body == std::fs::read(&kernel).unwrap());
    c.storage()
        .unwrap()
        .write_bytes("pxe cfg/a+b.txt", b"menu".to_vec())
        .await
        .unwrap();
    let (ok, body) = curl(&[&format!("{url}/pxe%20cfg/a+b.txt")]);
    assert!(ok && body == b"menu", "{}", String::from_utf8_lossy(&body));
    // A byte range, as bootloaders and opendal's http service ask: 206 and that part.
    let (ok, part) = curl(&["-r", "5-9", &file_url]);
    assert!(ok && part == std::fs::read(&kernel).unwrap()[5..10]);
    let (_, out) = curl(&[
        "-r",
        "9999999-",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &file_url,
    ]);
    assert_eq!(String::from_utf8_lossy(&out), "416");
    let (ok, head) = curl(&["-I", &file_url]);
    assert!(ok && String::from_utf8_lossy(&head).contains("content-length: 5242883"));
    // Missing files, traversal and directories are refused; the server goes on.
    for (path, code) in [
        ("/missing", "404"),
        ("/../../../../etc/passwd", "404"),
        ("/%2e%2e/%2e%2e/etc/passwd", "404"),
        ("/boot", "403"),
    ] {
        let (_, out) = curl(&[
            "--path-as-is",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &format!("{url}{path}"),
        ]);
        assert_eq!(String::from_utf8_lossy(&out), code, "{path}");
    }
    let (_, out) = curl(&[
        "-X",
        "POST",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &file_url,
    ]);
    assert_eq!(String::from_utf8_lossy(&out), "405");

    // A second HttpServer on the same port: a clear error naming the field.
    let other = HttpServer::from_args(&boot_server_args(
        &dir.path().join("www2"),
        c.get_port().await.unwrap(),
    ))
    .unwrap();
    let served2 = Served::start(vec![("http2", other)]);
    let session2 = served2.client().await;
    let c2 = HttpServerClient(session2.driver("http2").unwrap());
    let e = c2.start().await.unwrap_err();
    assert!(e.to_string().contains("port"), "{e}");
    assert_eq!(
        c2.get_port().await.unwrap(),
        0,
        "the failed server still answers"
    );

    c.stop().await.unwrap();
    assert_eq!(c.get_port().await.unwrap(), 0);
    let (ok, _) = curl(&[&file_url]);
    assert!(!ok, "the stopped server still answered");
    // `j NAME get-url`, `start` and the storage child through `j`.
    let cmd = jumpstarter_drivers::j_command(&session).await;
    for args in [
        vec!["j", "http", "start"],
        vec!["j", "http", "get-port"],
        vec!["j", "http", "storage", "exists", "boot/vmlinuz"],
        vec!["j", "http", "stop"],
    ] {
        let m = cmd.clone().try_get_matches_from(&args).unwrap();
        jumpstarter_drivers::run_j_command(session.root(), m)
            .await
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    }
}

/// A TFTP download with tftp-hpa's client (RFC 1350, no options).
fn tftp_get(port: u16, name: &str, out: &Path) -> bool {
    Command::new("tftp")
        .args([
            "-m",
            "binary",
            "127.0.0.1",
            &port.to_string(),
            "-c",
            "get",
            name,
        ])
        .arg(out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
        && out.exists()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tftp_serves_what_its_storage_child_writes() {
    if !have_tool("tftp", "tftp-hpa") || !have_tool("curl", "curl") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("tftpboot");
    let tftp = Tftp::from_args(&boot_server_args(&root, 0)).unwrap();
    let served = Served::start(vec![("tftp", tftp)]);
    let session = served.client().await;
    let c = TftpServerClient(session.driver("tftp").unwrap());
    c.start().await.unwrap();
    c.start().await.unwrap(); // already running: a warning, as upstream
    let port = c.get_port().await.unwrap();
    assert_ne!(port, 0);
    assert_eq!(c.get_host().await.unwrap(), "127.0.0.1");

    let kernel = dir.path().join("vmlinuz");
    random_file(&kernel, 3 * 1024 * 1024 + 512, 31);
    let storage = c.storage().unwrap();
    storage
        .write_from_path("vmlinuz", &kernel, &TransferOptions::default())
        .await
        .unwrap();
    storage
        .write_bytes("pxelinux.cfg/default", b"DEFAULT linux\n".to_vec())
        .await
        .unwrap();
    let want = std::fs::read(&kernel).unwrap();

    // tftp-hpa: plain RFC 1350 (512-byte blocks; the size is a multiple of 512, so the
    // transfer ends with an empty block).
    let out = dir.path().join("out1");
    let p = port;
    let o = out.clone();
    assert!(
        tokio::task::spawn_blocking(move || tftp_get(p, "vmlinuz", &o))
            .await
            .unwrap()
    );
    assert!(std::fs::read(&out).unwrap() == want);
    let out = dir.path().join("out2");
    let o = out.clone();
    assert!(
        tokio::task::spawn_blocking(move || tftp_get(p, "pxelinux.cfg/default", &o))
            .await
            .unwrap()
    );
    assert_eq!(std::fs::read(&out).unwrap(), b"DEFAULT linux\n");

    // curl: blksize and tsize options (OACK).
    let url = format!("tftp://127.0.0.1:{port}/vmlinuz");
    let (ok, body) = tokio::task::spawn_blocking(move || curl(&["--tftp-blksize", "1428", &url]))
        .await
        .unwrap();
    assert!(ok && body == want);

    // Missing files and traversal: an error packet (tftp-hpa prints it), the server goes on.
    for (name, code) in [
        ("missing", "Error code 1"),
        ("../../../etc/passwd", "Error code 2"),
    ] {
        let o = dir.path().join("never");
        let out = tokio::task::spawn_blocking(move || {
            Command::new("tftp")
                .args([
                    "-m",
                    "binary",
                    "127.0.0.1",
                    &p.to_string(),
                    "-c",
                    "get",
                    name,
                ])
                .arg(&o)
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(text.contains(code), "{name}: {text}");
    }
    let url = format!("tftp://127.0.0.1:{port}/missing");
    let (ok, _) = tokio::task::spawn_blocking(move || curl(&[&url]))
        .await
        .unwrap();
    assert!(!ok);

    // A second Tftp on the same UDP port: a clear error naming the field.
    let other = Tftp::from_args(&boot_server_args(&dir.path().join("t2"), port)).unwrap();
    let served2 = Served::start(vec![("tftp2", other)]);
    let session2 = served2.client().await;
    let c2 = TftpServerClient(session2.driver("tftp2").unwrap());
    let e = c2.start().await.unwrap_err();
    assert!(e.to_string().contains("port"), "{e}");
    assert_eq!(c2.get_host().await.unwrap(), "127.0.0.1");

    c.stop().await.unwrap();
    let url = format!("tftp://127.0.0.1:{port}/pxelinux.cfg/default");
    let (ok, _) = tokio::task::spawn_blocking(move || curl(&["--max-time", "5", &url]))
        .await
        .unwrap();
    assert!(!ok, "the stopped server still answered");
}

#[test]
fn boot_server_configs_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    for (ty, cfg) in [
        (
            "http",
            serde_json::json!({"root_dir": dir.path(), "bogus": 1}),
        ),
        (
            "http",
            serde_json::json!({"root_dir": dir.path(), "timeout": 0}),
        ),
        ("http", serde_json::json!({"root_dir": "/proc/nope/x"})),
        (
            "tftp",
            serde_json::json!({"root_dir": dir.path(), "port": "x"}),
        ),
        ("tftp", serde_json::json!({"root_dir": "/proc/nope/x"})),
    ] {
        let args = DriverArgs {
            config: cfg.clone(),
        };
        let r = if ty == "http" {
            HttpServer::from_args(&args).map(|_| ())
        } else {
            Tftp::from_args(&args).map(|_| ())
        };
        assert!(r.is_err(), "{ty} {cfg}");
    }
    let types: Vec<String> = jumpstarter_drivers::stock_registry()
        .types()
        .map(str::to_string)
        .collect();
    for t in [
        "jumpstarter_driver_http.driver.HttpServer",
        "jumpstarter_driver_tftp.driver.Tftp",
    ] {
        assert!(types.iter().any(|x| x == t), "{t}");
    }
}

/// Reads the rest of open file `fd` (from its position) through `file_read`.
async fn read_rest(
    s: &OpendalClient,
    fd: uuid::Uuid,
) -> Result<Vec<u8>, jumpstarter_core::ClientError> {
    use tokio::io::AsyncReadExt;
    let (tx, mut rx) = tokio::io::duplex(64 * 1024);
    let collect = tokio::spawn(async move {
        let mut v = Vec::new();
        rx.read_to_end(&mut v).await.map(|_| v)
    });
    let c = s.clone();
    s.0.download(tx, None, |h| async move {
        c.0.call::<()>("file_read", (fd, h)).await
    })
    .await?;
    Ok(collect.await.unwrap().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opendal_http_scheme_reads_what_a_real_http_server_serves() {
    let dir = tempfile::tempdir().unwrap();
    let www = dir.path().join("www");
    std::fs::create_dir_all(www.join("images")).unwrap();
    let big = www.join("images/disk image+1.raw");
    random_file(&big, 3 * 1024 * 1024 + 11, 5);
    let data = std::fs::read(&big).unwrap();
    std::fs::write(www.join("images/cmdline.txt"), b"console=ttyS0\n").unwrap();

    // The server: our HttpServer driver (a real HTTP/1.1 server on loopback, with ranges).
    let http = HttpServer::from_args(&boot_server_args(&www, 0)).unwrap();
    let served_http = Served::start(vec![("http", http)]);
    let http_session = served_http.client().await;
    let hc = HttpServerClient(http_session.driver("http").unwrap());
    hc.start().await.unwrap();
    let endpoint = hc.get_url().await.unwrap();

    // The client: an Opendal driver with scheme http, as upstream's config spells it.
    let web = jumpstarter_drivers::Opendal::from_args(&DriverArgs {
        config: serde_json::json!({
            "scheme": "http",
            "kwargs": {"endpoint": endpoint, "root": "/images"},
        }),
    })
    .unwrap();
    let served = Served::start(vec![("web", web)]);
    let session = served.client().await;
    let s = OpendalClient(session.driver("web").unwrap());

    assert_eq!(
        s.read_bytes("cmdline.txt").await.unwrap(),
        b"console=ttyS0\n"
    );
    let meta = s.stat("disk image+1.raw").await.unwrap();
    assert_eq!(meta.content_length, data.len() as u64);
    assert!(s.exists("disk image+1.raw").await.unwrap());
    assert!(!s.exists("nothing.raw").await.unwrap());
    let local = dir.path().join("copy.raw");
    s.read_into_path("disk image+1.raw", &local, &TransferOptions::default())
        .await
        .unwrap();
    assert!(std::fs::read(&local).unwrap() == data);
    let digest = s
        .hash("disk image+1.raw", jumpstarter_drivers::HashAlgo::Sha256)
        .await
        .unwrap();
    assert_eq!(digest, crate::storage::sha256_of(&big).await.0);
    // A seek, then a read from there: a range request the server answers with 206.
    let f = s.open("disk image+1.raw", "rb").await.unwrap();
    let pos: u64 =
        s.0.call("file_seek", (f.fd(), 1_000_003i64, 0u8))
            .await
            .unwrap();
    assert_eq!(pos, 1_000_003);
    let rest = read_rest(&s, f.fd()).await.unwrap();
    assert!(
        rest == data[1_000_003..],
        "{} bytes read after the seek",
        rest.len()
    );
    f.close().await.unwrap();
    // presign-read names the file's own URL (no credentials configured), as opendal does.
    let p = s.presign(Presign::Read, "cmdline.txt", 60).await.unwrap();
    assert_eq!(p.url, format!("{endpoint}/images/cmdline.txt"));

    // Read-only, as opendal's http service: writes are refused with a clear error.
    let e = s.write_bytes("new.txt", b"x".to_vec()).await.unwrap_err();
    assert!(e.to_string().contains("not supported"), "{e}");
    let e = s.delete("cmdline.txt").await.unwrap_err();
    assert!(e.to_string().contains("not supported"), "{e}");
    let e = s.read_bytes("missing.txt").await.unwrap_err();
    assert!(e.to_string().contains("NotFound"), "{e}");
    assert!(www.join("images/cmdline.txt").exists());

    // A server that is gone: a clear error naming the URL, and the exporter goes on.
    hc.stop().await.unwrap();
    let e = s.read_bytes("cmdline.txt").await.unwrap_err();
    assert!(
        e.to_string().contains("cannot connect") && e.to_string().contains(&endpoint),
        "{e}"
    );

    // Bad configs are refused at start, naming the option.
    for (kwargs, what) in [
        (serde_json::json!({}), "kwargs.endpoint: missing"),
        (
            serde_json::json!({"endpoint": "not a url"}),
            "kwargs.endpoint: \"not a url\" is not a URL",
        ),
        (
            serde_json::json!({"endpoint": "ftp://127.0.0.1/"}),
            "kwargs.endpoint: \"ftp://127.0.0.1/\" is not an http:// or https:// URL",
        ),
    ] {
        let e = jumpstarter_drivers::Opendal::from_args(&DriverArgs {
            config: serde_json::json!({"scheme": "http", "kwargs": kwargs}),
        })
        .err()
        .unwrap();
        assert!(e.to_string().contains(what), "{e}");
    }
}

/// The QEMU board's flasher client passes a URL to the exporter (as upstream's client
/// does): the exporter follows the redirect, keeps the encoding, expands a compressed
/// image; a dump to a URL is refused by the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_flasher_flashes_from_a_url() {
    use jumpstarter_core::wire::resource::{ContentEncoding, encoder};
    use jumpstarter_drivers::{Progress, Qemu, QemuFlasherClient};

    let raw: Vec<u8> = (0..400_000u32).flat_map(|i| i.to_be_bytes()).collect();
    let dir = tempfile::tempdir().unwrap();
    let gz_path = dir.path().join("img.gz");
    let mut w = encoder(
        tokio::fs::File::create(&gz_path).await.unwrap(),
        Some(ContentEncoding::Gzip),
    );
    w.write_all(&raw).await.unwrap();
    w.shutdown().await.unwrap();
    let gz = std::fs::read(&gz_path).unwrap();
    assert!(gz.len() < raw.len());
    let (base, server) = image_server(raw.clone()).await;
    let (gz_base, gz_server) = image_server(gz).await;

    let board = Qemu::from_args(&DriverArgs {
        config: serde_json::json!({"mem": "256M"}),
    })
    .unwrap();
    let served = Served::start(vec![("board", board)]);
    let session = served.client().await;
    let flasher = QemuFlasherClient(session.driver("board.flasher").unwrap());
    let back = dir.path().join("back");

    flasher
        .flash(
            Path::new(&format!("{base}/latest")),
            None,
            &Progress::hidden(),
        )
        .await
        .unwrap();
    flasher
        .dump(&back, None, &Progress::hidden())
        .await
        .unwrap();
    assert!(std::fs::read(&back).unwrap() == raw);

    flasher
        .flash(
            Path::new(&format!("{gz_base}/images/disk%20image%2B1.raw?sig=a%2Fb")),
            Some("bios"),
            &Progress::hidden(),
        )
        .await
        .unwrap();
    flasher
        .dump(&back, Some("bios"), &Progress::hidden())
        .await
        .unwrap();
    assert!(
        std::fs::read(&back).unwrap() == raw,
        "the gzip image was not expanded"
    );

    let e = flasher
        .flash(
            Path::new(&format!("{base}/none")),
            None,
            &Progress::hidden(),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("404"), "{e}");
    let e = flasher
        .dump(Path::new(&format!("{base}/up")), None, &Progress::hidden())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("cannot dump to a URL"), "{e}");
    // An OCI reference reaches the exporter, which refuses it by name (not a local file).
    let e = flasher
        .flash(
            Path::new("oci://quay.io/example/image:latest"),
            None,
            &Progress::hidden(),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("OCI images (oci://)"), "{e}");
    // The failed flash left the image in place.
    flasher
        .dump(&back, None, &Progress::hidden())
        .await
        .unwrap();
    assert!(std::fs::read(&back).unwrap() == raw);
    server.abort();
    gz_server.abort();
}
