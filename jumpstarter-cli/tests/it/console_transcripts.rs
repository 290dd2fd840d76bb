//! Console transcripts fetched after the lease through the controller: the exporter pushes
//! each transcript's records with the lease's other entries, and `jmp get lease NAME
//! --console` prints them to the lease's own client; a console with `transcript: false`
//! pushes nothing, another client is told the lease does not exist.

use std::{path::Path, time::Duration};

use jumpstarter_controller::objects::ExporterStatusValue;
use serde_json::Value;

use crate::{
    JMP,
    distributed::{Lab, finish, lab, shell},
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
    let lab = lab().await;
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

    // Another client is told the lease does not exist.
    let (ok, objects, err) = console(&lab, &other, &lease).await;
    assert!(!ok && objects.is_empty(), "{objects:?}");
    assert!(err.contains("not found"), "{err}");
}
