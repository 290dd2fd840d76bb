//! One writer and read-only observers on a serial console served by `jmp run`: a
//! pseudo-terminal stands for the serial line, the test holds the board's end.

use std::{
    io::{BufRead, BufReader, Read, Write},
    process::{ChildStdin, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use jumpstarter_drivers::Pty;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{J, JMP, Running, Scratch, hooks::upstream_venv, start_exporter, text};

const WAIT: Duration = Duration::from_secs(20);

fn config(device: &str) -> String {
    config_with(device, "")
}

/// [`config`] with `extra` (indented) lines in the console's config.
fn config_with(device: &str, extra: &str) -> String {
    format!(
        "apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterConfig
metadata:
  namespace: default
  name: observed
endpoint: \"\"
token: \"\"
export:
  serial:
    type: jumpstarter_driver_pyserial.driver.PySerial
    config:
      url: \"{device}\"
{extra}"
    )
}

/// A `j` process whose stdout is collected as it comes.
struct Client {
    _proc: Running,
    stdin: Option<ChildStdin>,
    out: Arc<Mutex<Vec<u8>>>,
}

impl Client {
    fn seen(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap()).into_owned()
    }

    /// Waits (bounded) until its stdout contains `want`.
    fn wait_for(&self, want: &str, what: &str) {
        let deadline = Instant::now() + WAIT;
        while !self.seen().contains(want) {
            assert!(
                Instant::now() < deadline,
                "{what} never printed {want:?}: {:?}",
                self.seen()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(bytes).unwrap();
        stdin.flush().unwrap();
    }
}

struct Lab {
    s: Scratch,
    _exporter: Running,
    addr: String,
    board: Pty,
}

impl Lab {
    fn start() -> Self {
        Self::start_with("")
    }

    /// [`Lab::start`] with `extra` lines in the console's config.
    fn start_with(extra: &str) -> Self {
        let board = Pty::open().unwrap();
        let s = Scratch::new();
        s.write(
            "exporter.yaml",
            &config_with(&board.device_path.display().to_string(), extra),
        );
        let (exporter, port) = start_exporter(&s, &["--tls-grpc-insecure"]);
        Self {
            s,
            _exporter: exporter,
            addr: format!("127.0.0.1:{port}"),
            board,
        }
    }

    /// As [`Lab::start`], with the console served by upstream's Python `PySerial` through the
    /// exporter's Python child (the venv's interpreter). `None` when the venv is missing
    /// outside CI.
    fn start_python() -> Option<Self> {
        let venv = upstream_venv()?;
        let board = Pty::open().unwrap();
        let s = Scratch::new();
        s.write(
            "exporter.yaml",
            &config(&board.device_path.display().to_string()),
        );
        let mut c = s.cmd(JMP);
        c.args(["run", "--exporter-config"])
            .arg(s.path("exporter.yaml"))
            .args(["--tls-grpc-listener", "127.0.0.1:0", "--tls-grpc-insecure"])
            .env("JMP_PYTHON", venv.join("bin/python3"))
            .env(
                "JMP_PYTHON_DRIVERS",
                "jumpstarter_driver_pyserial.driver.PySerial",
            )
            .stderr(Stdio::piped())
            .stdout(Stdio::null());
        let mut child = c.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let exporter = Running(child);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let port = loop {
            let line = rx
                .recv_timeout(Duration::from_secs(90))
                .expect("jmp run did not report its address");
            if let Some(rest) = line.split("listening on ").nth(1) {
                let addr = rest.split_whitespace().next().unwrap();
                break addr.rsplit(':').next().unwrap().parse::<u16>().unwrap();
            }
        };
        // The console is Python's: the exporter runs the venv's interpreter as its child.
        let pid = exporter.0.id();
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
        let python = venv.join("bin/python3").display().to_string();
        assert!(
            children.split_whitespace().any(|c| {
                std::fs::read(format!("/proc/{c}/cmdline"))
                    .is_ok_and(|cmd| String::from_utf8_lossy(&cmd).contains(&python))
            }),
            "no Python child of the exporter: {children:?}"
        );
        Some(Self {
            s,
            _exporter: exporter,
            addr: format!("127.0.0.1:{port}"),
            board,
        })
    }

    fn j(&self, args: &[&str]) -> std::process::Command {
        let mut c = self.s.cmd(J);
        c.env("JUMPSTARTER_HOST", &self.addr)
            .env("JMP_GRPC_INSECURE", "1")
            .arg("serial")
            .args(args);
        c
    }

    /// Starts `j serial ARGS` with piped stdin and collected stdout.
    fn client(&self, args: &[&str]) -> Client {
        let mut child = self
            .j(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let mut stdout = child.stdout.take().unwrap();
        let out = Arc::new(Mutex::new(Vec::new()));
        let sink = out.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Client {
            _proc: Running(child),
            stdin,
            out,
        }
    }

    /// `j serial ARGS` to its end: (exit code, stdout, stderr).
    fn run(&self, args: &[&str]) -> (Option<i32>, String, String) {
        let out = self.j(args).output().unwrap();
        let (o, e) = text(&out);
        (out.status.code(), o, e)
    }

    /// Waits (bounded) until `console-status` prints `want`.
    fn wait_status(&self, want: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let (code, out, err) = self.run(&["console-status"]);
            assert_eq!(code, Some(0), "{out}{err}");
            if out.contains(want) {
                return out;
            }
            assert!(
                Instant::now() < deadline,
                "status never had {want:?}: {out}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Reads what the clients sent to the board until it contains `want`.
    async fn board_reads(&mut self, want: &str) -> String {
        let mut seen = Vec::new();
        let mut buf = [0u8; 1024];
        tokio::time::timeout(WAIT, async {
            while !String::from_utf8_lossy(&seen).contains(want) {
                let n = self.board.controller.read(&mut buf).await.unwrap();
                seen.extend_from_slice(&buf[..n]);
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the board got {:?}", String::from_utf8_lossy(&seen)));
        String::from_utf8_lossy(&seen).into_owned()
    }

    async fn board_says(&mut self, text: &str) {
        self.board
            .controller
            .write_all(text.as_bytes())
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_and_two_observers_one_late_share_a_console() {
    let mut lab = Lab::start();
    let status = lab.wait_status("Reader running: False");
    assert!(status.contains("Write token holder: (none)"), "{status}");

    let mut writer = lab.client(&["pipe"]);
    let early = lab.client(&["pipe", "--observe"]);
    lab.wait_status("Total clients: 2");
    lab.board_says("U-Boot 2026.01\r\nboard login: ").await;
    writer.wait_for("board login: ", "the writer");
    early.wait_for("board login: ", "the early observer");

    // The writer types to the board.
    writer.send(b"root\n");
    lab.board_reads("root\n").await;

    // An observer's bytes never reach the board: the exporter refuses its writes (the raw
    // stream, stdin sent), and it reads on.
    let mut sneaky = lab.client(&["open-stream", "observe", "--input"]);
    lab.wait_status("Observers: 2");
    sneaky.send(b"reboot\n");
    // A late observer gets the scrollback, then live bytes.
    let late = lab.client(&["pipe", "--observe"]);
    late.wait_for("U-Boot 2026.01\r\nboard login: ", "the late observer");
    let status = lab.wait_status("Observers: 3");
    assert!(
        status.contains("Write token holder: connection")
            && status.contains("Total clients: 4")
            && status.contains("Reader running: True"),
        "{status}"
    );
    lab.board_says("\r\nroot@board:~# ").await;
    for (c, who) in [
        (&writer, "the writer"),
        (&early, "the early observer"),
        (&late, "the late observer"),
        (&sneaky, "the observer that typed"),
    ] {
        c.wait_for("root@board:~# ", who);
    }
    // The writer types once more: the board gets that, and never the observer's line.
    writer.send(b"uname\n");
    let got = lab.board_reads("uname\n").await;
    assert!(
        !got.contains("reboot"),
        "an observer wrote to the board: {got:?}"
    );
    // The writer saw nothing twice (no scrollback for it).
    assert_eq!(
        writer.seen().matches("U-Boot").count(),
        1,
        "{}",
        writer.seen()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_past_its_budget_reads_the_newest_bytes_after_a_marker_and_the_writer_all() {
    // Each observer may receive 2 KB/s after its first 64 KB; the board prints 256 KiB of
    // numbered lines as fast as the pty takes them.
    let mut lab = Lab::start_with("      observer_bytes_per_second: 2048\n");
    let writer = lab.client(&["pipe"]);
    let observer = lab.client(&["pipe", "--observe"]);
    lab.wait_status("Total clients: 2");
    let mut source: String = (0..32768).map(|i| format!("{i:07}\n")).collect();
    source.push_str("the end\n");
    lab.board_says(&source).await;
    writer.wait_for("the end\n", "the writer");
    observer.wait_for("the end\n", "the observer");
    assert!(writer.seen() == source, "the writer lost bytes");
    // The observer read stretches of the board's output in order, each after a marker that
    // counts exactly the bytes it skipped, and ends with the newest.
    let seen = observer.seen();
    let (mut at, mut pos, mut received, mut markers) = (0, 0, 0, 0);
    while at < seen.len() {
        let rest = &seen[at..];
        let next = rest.find("\r\n[");
        let data = &rest[..next.unwrap_or(rest.len())];
        assert_eq!(
            data,
            &source[pos..pos + data.len()],
            "a stretch at byte {pos} is not the board's"
        );
        (pos, received, at) = (pos + data.len(), received + data.len(), at + data.len());
        if next.is_some() {
            let end = at + seen[at..].find("]\r\n").unwrap();
            let n: usize = seen[at + 3..end]
                .strip_suffix(" bytes dropped")
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("not a marker: {:?}", &seen[at..end + 3]));
            (pos, markers, at) = (pos + n, markers + 1, end + 3);
        }
    }
    assert_eq!(pos, source.len(), "stretches and markers cover the output");
    assert!(
        markers >= 1,
        "nothing was dropped: {received} bytes received"
    );
    assert!(
        received < source.len() / 2,
        "{received} of {} bytes at 2 KB/s",
        source.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_console_lets_another_client_write() {
    let mut lab = Lab::start();
    let mut first = lab.client(&["pipe"]);
    lab.wait_status("Write token holder: connection");
    first.send(b"one\n");
    lab.board_reads("one\n").await;

    // A second writer is refused while the first holds the seat, with upstream's words.
    let (code, out, err) = lab.run(&["pipe", "--no-input"]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        err.contains("Console in use. Use --observe or release-console."),
        "{err}"
    );

    let (code, out, err) = lab.run(&["release-console"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(err.contains("Write token released."), "{err}");
    let status = lab.wait_status("Write token holder: (none)");
    assert!(
        status.contains("Observers: 1"),
        "the first reads on: {status}"
    );
    first.wait_for("[write token revoked]", "the released writer");

    let mut second = lab.client(&["pipe"]);
    lab.wait_status("Write token holder: connection");
    second.send(b"two\n");
    lab.board_reads("two\n").await;
    // Both read the board.
    lab.board_says("ok\r\n").await;
    first.wait_for("ok\r\n", "the released writer");
    second.wait_for("ok\r\n", "the new writer");
}

/// Upstream's Python `PySerial` (0.9.0, which knows nothing of observers) served through the
/// exporter's Python child: the exporter shares its `connect` stream as it shares the Rust
/// driver's, so `--observe`, `release-console` and `console-status` work the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_served_console_takes_observers_too() {
    let Some(mut lab) = Lab::start_python() else {
        return;
    };
    let status = lab.wait_status("Reader running: False");
    assert!(status.contains("Write token holder: (none)"), "{status}");
    let mut writer = lab.client(&["pipe"]);
    let observer = lab.client(&["pipe", "--observe"]);
    lab.wait_status("Total clients: 2");
    lab.board_says("U-Boot 2026.01\r\nboard login: ").await;
    writer.wait_for("board login: ", "the writer");
    observer.wait_for("board login: ", "the observer");
    writer.send(b"root\n");
    lab.board_reads("root\n").await;

    // A second writer is refused; an observer's input never reaches the board.
    let (code, out, err) = lab.run(&["pipe", "--no-input"]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        err.contains("Console in use. Use --observe or release-console."),
        "{err}"
    );
    let mut sneaky = lab.client(&["open-stream", "observe", "--input"]);
    lab.wait_status("Observers: 2");
    sneaky.send(b"reboot\n");
    // A late observer gets the scrollback.
    let late = lab.client(&["pipe", "--observe"]);
    late.wait_for("U-Boot 2026.01\r\nboard login: ", "the late observer");

    let (code, out, err) = lab.run(&["release-console"]);
    assert_eq!(code, Some(0), "{out}{err}");
    lab.wait_status("Write token holder: (none)");
    writer.wait_for("[write token revoked]", "the released writer");
    let mut second = lab.client(&["pipe"]);
    lab.wait_status("Write token holder: connection");
    second.send(b"uname\n");
    let got = lab.board_reads("uname\n").await;
    assert!(
        !got.contains("reboot"),
        "an observer wrote to the board: {got:?}"
    );
    lab.board_says("Linux\r\n").await;
    for (c, who) in [
        (&writer, "the released writer"),
        (&observer, "the observer"),
        (&late, "the late observer"),
        (&second, "the new writer"),
    ] {
        c.wait_for("Linux\r\n", who);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_refuses_input_flags_as_upstream() {
    let lab = Lab::start();
    for (args, want) in [
        (["pipe", "--observe", "--input"], "--observe and --input"),
        (
            ["pipe", "--observe", "--no-output"],
            "--observe and --no-output",
        ),
    ] {
        let (code, out, err) = lab.run(&args);
        assert_eq!(code, Some(1), "{out}{err}");
        assert!(err.contains(want), "{err}");
    }
}

/// `consoleTranscripts`: a leased console's bytes both ways are kept on the exporter's disk
/// after the lease, in the lease's directory; a console with `transcript: false` is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leases_console_transcript_is_kept_after_it_and_a_secret_console_is_not() {
    use crate::distributed::{finish, lab, shell};
    use jumpstarter_controller::objects::ExporterStatusValue;

    let lab = lab().await;
    let cfg = lab.exporter("ex-tape", &[("board", "tape")]).await;
    let transcripts = lab.path("transcripts");
    let yaml = std::fs::read_to_string(&cfg).unwrap().replace(
        "export:\n",
        &format!(
            "consoleTranscripts:\n  dir: {}\n  keepLeases: 5\nexport:\n",
            transcripts.display()
        ),
    ) + "  serial:\n    type: jumpstarter_driver_pyserial.driver.PySerial\n    config:\n      \
         url: \"loop://\"\n  secret:\n    type: jumpstarter_driver_pyserial.driver.PySerial\n    \
         config:\n      url: \"loop://\"\n      transcript: false\n";
    std::fs::write(&cfg, yaml).unwrap();
    let client = lab.client("taper").await;
    let _exporter = lab.run_exporter(&cfg, "ex-tape.log");
    lab.wait_status("ex-tape", ExporterStatusValue::Available)
        .await;
    let child = shell(
        &lab,
        &client,
        &["-l", "board=tape"],
        "echo \"lease=$JMP_LEASE\"; printf 'hello board\\n' | j serial pipe -i || exit 7; \
         printf 'password\\n' | j secret pipe -i || exit 8",
    );
    let (code, stdout, stderr) = finish(child).await;
    assert_eq!(code, 0, "{stdout}{stderr}{}", lab.log("ex-tape.log"));
    let lease = stdout
        .split("lease=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_default()
        .to_string();
    assert!(!lease.is_empty(), "{stdout}");
    assert!(stdout.contains("hello board"), "{stdout}");
    let path = transcripts.join(&lease).join("serial.log");
    let deadline = Instant::now() + WAIT;
    let text = loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.contains("board->client \"hello board\\n\"") {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "{}: {text:?} (lease directory: {:?}); exporter log:\n{}",
            path.display(),
            std::fs::read_dir(transcripts.join(&lease))
                .map(|d| d.map(|e| e.map(|e| e.file_name())).collect::<Vec<_>>()),
            lab.log("ex-tape.log")
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        text.starts_with(&format!("# console serial, lease {lease}, client taper\n")),
        "{text}"
    );
    assert!(text.contains(" client->board \"hello board\\n\""), "{text}");
    let entries: Vec<String> = std::fs::read_dir(transcripts.join(&lease))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(entries, ["serial.log"], "the secret console was recorded");
}
