//! Console transcripts fetched after the lease through the controller: the exporter pushes
//! each transcript's records with the lease's other entries, and `jmp get lease NAME
//! --console` prints them to the lease's own client; a console with `transcript: false`
//! pushes nothing, another client is told the lease does not exist.

use std::{path::Path, time::Duration};

use jumpstarter_controller::objects::ExporterStatusValue;
use serde_json::Value;

use crate::{
    JMP,
    distributed::{Lab, finish, lab, lab_with, shell},
};

/// `jmp get lease LEASE --console -o json` as `client`: (success, objects, stderr).
async fn console(lab: &Lab, client: &Path, lease: &str) -> (bool, Vec<Value>, String) {
    let out = lab
        .cmd(JMP)
        .args([
            "get",
            "lease",
            lease,
            "--console",
            "-o",
            "json",
            "--client-config",
        ])
        .arg(client)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let objects = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    (
        out.status.success(),
        objects,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leases_console_transcript_is_read_after_it_by_its_client_only() {
    let lab = lab_with(|c| c.admin_config = Some(c.data_dir.join("admin.yaml"))).await;
    let cfg = lab.exporter("ex-tty", &[("board", "tty")]).await;
    let transcripts = lab.path("transcripts");
    let yaml = std::fs::read_to_string(&cfg).unwrap().replace(
        "export:\n",
        &format!(
            "consoleTranscripts:\n  dir: {}\nexport:\n",
            transcripts.display()
        ),
    ) + "  serial:\n    type: jumpstarter_driver_pyserial.driver.PySerial\n    config:\n      \
         url: \"loop://\"\n  secret:\n    type: jumpstarter_driver_pyserial.driver.PySerial\n    \
         config:\n      url: \"loop://\"\n      transcript: false\n";
    std::fs::write(&cfg, yaml).unwrap();
    let client = lab.client("typist").await;
    let other = lab.client("other").await;
    let _exporter = lab.run_exporter(&cfg, "ex-tty.log");
    lab.wait_status("ex-tty", ExporterStatusValue::Available)
        .await;
    // The console echoes (loop://): what the client wrote comes back from the board.
    let child = shell(
        &lab,
        &client,
        &["-l", "board=tty"],
        "echo \"lease=$JMP_LEASE\"; printf 'hello board\\n' | j serial pipe -i || exit 7; \
         printf 'hunter2\\n' | j secret pipe -i || exit 8",
    );
    let (code, stdout, stderr) = finish(child).await;
    assert_eq!(code, 0, "{stdout}{stderr}{}", lab.log("ex-tty.log"));
    let lease = stdout
        .split("lease=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_default()
        .to_string();
    assert!(!lease.is_empty(), "{stdout}");

    // The lease has ended; its records reach the controller in the background (bounded).
    let mut records = Vec::new();
    for _ in 0..120 {
        let (ok, objects, err) = console(&lab, &client, &lease).await;
        assert!(ok, "{err}");
        records = objects;
        let both = ["client->board", "board->client"]
            .iter()
            .all(|d| records.iter().any(|o| o["direction"] == *d));
        if both {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let lines: Vec<(String, String, String)> = records
        .iter()
        .map(|o| {
            assert!(
                o["timestamp"]
                    .as_str()
                    .is_some_and(|t| t.parse::<jiff::Timestamp>().is_ok()),
                "{o}"
            );
            assert_eq!(o["lease_id"], lease.as_str());
            (
                o["console"].as_str().unwrap_or_default().to_string(),
                o["direction"].as_str().unwrap_or_default().to_string(),
                o["text"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    for direction in ["client->board", "board->client"] {
        assert!(
            lines.contains(&(
                "serial".to_string(),
                direction.to_string(),
                "hello board\\n".to_string()
            )),
            "no {direction} line: {lines:?}; exporter log:\n{}",
            lab.log("ex-tty.log")
        );
    }
    // The console with transcript: false pushed nothing.
    assert!(
        lines
            .iter()
            .all(|(c, _, t)| c == "serial" && !t.contains("hunter2")),
        "{lines:?}"
    );

    // Text: time, console, direction, the bytes in quotes.
    let out = lab
        .cmd(JMP)
        .args(["get", "lease", &lease, "--console", "--client-config"])
        .arg(&client)
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.ends_with(" serial board->client \"hello board\\n\"")),
        "{text}"
    );

    // --logs tells the rest of the story, without the console's records.
    let out = lab
        .cmd(JMP)
        .args([
            "get",
            "lease",
            &lease,
            "--logs",
            "-o",
            "json",
            "--client-config",
        ])
        .arg(&client)
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{:?}", out);
    let story = String::from_utf8_lossy(&out.stdout);
    assert!(story.contains("\"lease created\""), "{story}");
    assert!(!story.contains("hello board"), "{story}");

    // The admin reads it too, and its --logs leaves it out as well.
    for (flag, has_console) in [("--console", true), ("--logs", false)] {
        let out = lab
            .cmd(JMP)
            .args(["admin", "logs", "--lease", &lease, "-o", "json"])
            .args((flag == "--console").then_some(flag))
            .env("JMP_ADMIN_CONFIG", lab.path("data/admin.yaml"))
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let printed = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            printed.contains("\"direction\":\"client->board\""),
            has_console,
            "jmp admin logs {flag}: {printed}"
        );
        assert!(!printed.is_empty(), "jmp admin logs {flag}");
    }

    // Another client is told the lease does not exist.
    let (ok, objects, err) = console(&lab, &other, &lease).await;
    assert!(!ok && objects.is_empty(), "{objects:?}");
    assert!(err.contains("not found"), "{err}");
}

/// The same with a board on a pseudo-terminal: what the client typed and what the board
/// answered are told apart by their direction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pty_boards_answer_and_the_typed_line_are_kept_each_with_its_direction() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let mut board = jumpstarter_drivers::Pty::open().unwrap();
    let lab = lab().await;
    let cfg = lab.exporter("ex-pty", &[("board", "pty")]).await;
    let yaml = std::fs::read_to_string(&cfg).unwrap().replace(
        "export:\n",
        &format!(
            "consoleTranscripts:\n  dir: {}\nexport:\n",
            lab.path("transcripts").display()
        ),
    ) + &format!(
        "  serial:\n    type: jumpstarter_driver_pyserial.driver.PySerial\n    config:\n      \
         url: \"{}\"\n",
        board.device_path.display()
    );
    std::fs::write(&cfg, yaml).unwrap();
    let client = lab.client("typist").await;
    let _exporter = lab.run_exporter(&cfg, "ex-pty.log");
    lab.wait_status("ex-pty", ExporterStatusValue::Available)
        .await;
    // The client types a line and keeps the console open until the test says `done`
    // (bounded: 60 s), printing what the board says to console.out; the board's console
    // never ends, so `j` is stopped then.
    let child = shell(
        &lab,
        &client,
        &["-l", "board=pty"],
        "echo \"lease=$JMP_LEASE\"; wait_done() { i=0; while [ ! -e done ] && [ $i -lt 600 ]; \
         do sleep 0.1; i=$((i+1)); done; }; (printf 'root\\n'; wait_done) 2>/dev/null \
         | j serial pipe -i > console.out & p=$!; wait_done; kill $p; wait $p; exit 0",
    );
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    tokio::time::timeout(Duration::from_secs(60), async {
        while !String::from_utf8_lossy(&seen).contains("root") {
            let n = board.controller.read(&mut buf).await.unwrap();
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the board got {:?}; exporter log:\n{}",
            String::from_utf8_lossy(&seen),
            lab.log("ex-pty.log")
        )
    });
    board.controller.write_all(b"welcome\r\n").await.unwrap();
    for _ in 0..600 {
        if lab.log("console.out").contains("welcome") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        lab.log("console.out").contains("welcome"),
        "the client never read the answer"
    );
    std::fs::write(lab.path("done"), "").unwrap();
    let (code, stdout, stderr) = finish(child).await;
    assert_eq!(code, 0, "{stdout}{stderr}{}", lab.log("ex-pty.log"));
    let lease = stdout
        .split("lease=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_default()
        .to_string();
    assert!(!lease.is_empty(), "{stdout}");

    let want = [
        ("client->board", "root\\n"),
        ("board->client", "welcome\\r\\n"),
    ];
    let mut lines = Vec::new();
    for _ in 0..120 {
        let (ok, objects, err) = console(&lab, &client, &lease).await;
        assert!(ok, "{err}");
        lines = objects
            .iter()
            .map(|o| {
                (
                    o["direction"].as_str().unwrap_or_default().to_string(),
                    o["text"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect::<Vec<_>>();
        if want
            .iter()
            .all(|(d, t)| lines.contains(&(d.to_string(), t.to_string())))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for (d, t) in want {
        assert!(
            lines.contains(&(d.to_string(), t.to_string())),
            "no {d} {t:?}: {lines:?}"
        );
    }
    // Neither went the other way.
    assert!(
        !lines.contains(&("board->client".to_string(), "root\\n".to_string())),
        "{lines:?}"
    );
}
