//! Console transcripts: what each console said and was told during a lease, kept on the
//! exporter's disk (`consoleTranscripts` of the exporter config).
//!
//! Layout: `DIR/LEASE/CONSOLE.log`, one directory per lease (named after the lease), one file
//! per console (named after the driver's path in the tree). A file starts with a header line
//! (`# console NAME, lease LEASE, client CLIENT`), then one line per chunk of bytes:
//!
//! ```text
//! 2026-12-07T01:02:03.456789Z board->client "U-Boot 2026.01\r\nboard login: "
//! 2026-12-07T01:02:04.001234Z client->board "root\r"
//! ```
//!
//! the bytes escaped as Rust byte strings are (`\r`, `\n`, `\x1b`, `\"`). A file stops
//! growing at `maxBytes` with a line saying so. Recording never slows a console: chunks go
//! through a bounded queue to a writer task, and when the queue is full they are counted and
//! a line says how many were lost. Retention: when a lease starts (and when the exporter
//! starts), lease directories beyond the newest `keepLeases`, and those older than
//! `maxAgeDays`, are removed.
//!
//! When the exporter pushes its leases' entries to the controller (log gathering, see
//! [`crate::telemetry`]), each transcript's records are pushed too, cut into lines and
//! chunks by a [`Batcher`] (a line ends after `\n`, and after a lone `\r` the client typed;
//! at most [`RECORD_MAX`] bytes; what waits longer than [`LINGER`] goes as it is), each an
//! entry marked `stream=console` with the console's name and the direction. A console with
//! `transcript: false` has no recorder, so nothing of it leaves the exporter.

use std::{
    collections::HashMap,
    io,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime},
};

use jumpstarter_core::{
    config::ConsoleTranscripts,
    driver::{ConsoleRecorder, Direction, DriverNode, Transcripts},
};

use crate::telemetry::LeaseTelemetry;
use tokio::{io::AsyncWriteExt, sync::mpsc};
use uuid::Uuid;

/// Chunks queued for a transcript's writer before new ones are dropped (and counted).
const QUEUE: usize = 1024;
/// Bytes of one pushed console record, at most.
pub const RECORD_MAX: usize = 1024;
/// How long bytes without a line end wait for more before they are pushed as they are.
pub const LINGER: Duration = Duration::from_millis(100);

/// Why a lease's transcripts cannot be kept.
#[derive(Debug, thiserror::Error)]
pub enum TranscriptError {
    /// The lease's directory cannot be made.
    #[error("cannot create the console transcript directory {}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// The transcripts of an exporter (see the module docs).
#[derive(Debug, Clone)]
pub struct TranscriptStore {
    cfg: ConsoleTranscripts,
}

impl TranscriptStore {
    /// A store as `consoleTranscripts` configures it.
    pub fn new(cfg: ConsoleTranscripts) -> Self {
        Self { cfg }
    }

    /// The transcripts of lease `lease` held by `client`: applies the retention bound, then
    /// makes the lease's directory.
    /// With `push`, the transcripts' records are pushed to the controller too.
    pub fn for_lease(
        &self,
        lease: &str,
        client: &str,
        tree: &DriverNode,
        push: Option<Arc<LeaseTelemetry>>,
    ) -> Result<Arc<LeaseTranscripts>, TranscriptError> {
        for removed in self.prune(SystemTime::now()) {
            tracing::info!(
                "console transcripts {} removed (retention)",
                removed.display()
            );
        }
        let dir = self.cfg.dir.join(file_name(lease));
        std::fs::create_dir_all(&dir).map_err(|source| TranscriptError::CreateDir {
            path: dir.clone(),
            source,
        })?;
        let mut names = HashMap::new();
        console_names(tree, "", &mut names);
        Ok(Arc::new(LeaseTranscripts {
            names,
            dir,
            lease: lease.to_string(),
            client: client.to_string(),
            max_bytes: self.cfg.max_bytes,
            push: push.map(Pushed),
        }))
    }

    /// Removes the lease directories beyond the newest `keepLeases` and those older than
    /// `maxAgeDays` (by their last change), as of `now`; returns what it removed. What
    /// cannot be read or removed is logged and left.
    pub fn prune(&self, now: SystemTime) -> Vec<PathBuf> {
        let entries = match std::fs::read_dir(&self.cfg.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Vec::new(),
            Err(e) => {
                tracing::warn!(
                    "console transcripts: cannot list {}: {e}",
                    self.cfg.dir.display()
                );
                return Vec::new();
            }
        };
        let mut leases: Vec<(SystemTime, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .collect();
        leases.sort_by_key(|l| std::cmp::Reverse(l.0));
        let max_age = Duration::from_secs(self.cfg.max_age_days.saturating_mul(86_400));
        let mut removed = Vec::new();
        for (i, (modified, path)) in leases.into_iter().enumerate() {
            let too_old = now.duration_since(modified).unwrap_or_default() > max_age;
            if i < self.cfg.keep_leases && !too_old {
                continue;
            }
            match std::fs::remove_dir_all(&path) {
                Ok(()) => removed.push(path),
                Err(e) => {
                    tracing::warn!("console transcripts: cannot remove {}: {e}", path.display())
                }
            }
        }
        removed
    }
}

/// A name safe as one path component: `/`, NUL and leading dots replaced.
fn file_name(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| if c == '/' || c == '\0' { '_' } else { c })
        .collect();
    if s.is_empty() || s.starts_with('.') {
        s.insert(0, '_');
    }
    s
}

/// The dotted path of every driver of `node`'s tree, by uuid (`serial`, `board.console`).
fn console_names(node: &DriverNode, prefix: &str, out: &mut HashMap<Uuid, String>) {
    for (name, child) in &node.children {
        let path = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        console_names(child, &path, out);
        out.insert(child.uuid, path);
    }
}

/// One lease's transcripts, given to its session.
#[derive(Debug)]
pub struct LeaseTranscripts {
    /// Each driver's path in the tree, by uuid: a transcript is named after its console.
    names: HashMap<Uuid, String>,
    dir: PathBuf,
    lease: String,
    client: String,
    max_bytes: u64,
    /// Where the records are pushed too (log gathering), if anywhere.
    push: Option<Pushed>,
}

/// The lease's telemetry, as a field of a `Debug` struct.
struct Pushed(Arc<LeaseTelemetry>);

impl std::fmt::Debug for Pushed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pushed")
    }
}

impl LeaseTranscripts {
    /// The lease's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Transcripts for LeaseTranscripts {
    fn recorder(&self, uuid: Option<Uuid>, type_name: &str) -> Option<Arc<dyn ConsoleRecorder>> {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return None;
        };
        let name = uuid
            .and_then(|u| self.names.get(&u))
            .map_or(type_name, String::as_str);
        let path = self.dir.join(format!("{}.log", file_name(name)));
        let (tx, rx) = mpsc::channel(QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        let header = format!(
            "# console {name}, lease {}, client {}\n",
            self.lease, self.client
        );
        let file = TranscriptFile {
            path,
            header,
            max_bytes: self.max_bytes,
            dropped: dropped.clone(),
        };
        let push = self.push.as_ref().map(|p| ConsolePush {
            telemetry: p.0.clone(),
            console: name.to_string(),
        });
        rt.spawn(record_console(rx, file, push));
        Some(Arc::new(FileRecorder { tx, dropped }))
    }
}

struct Chunk {
    at: jiff::Timestamp,
    direction: Direction,
    bytes: Vec<u8>,
}

/// Queues chunks for [`write_transcript`]; never waits.
struct FileRecorder {
    tx: mpsc::Sender<Chunk>,
    dropped: Arc<AtomicU64>,
}

impl ConsoleRecorder for FileRecorder {
    fn record(&self, direction: Direction, bytes: &[u8]) {
        let chunk = Chunk {
            at: jiff::Timestamp::now(),
            direction,
            bytes: bytes.to_vec(),
        };
        if self.tx.try_send(chunk).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn direction_name(direction: Direction) -> &'static str {
    match direction {
        Direction::BoardToClient => "board->client",
        Direction::ClientToBoard => "client->board",
    }
}

/// One transcript line.
fn line(chunk: &Chunk) -> String {
    format!(
        "{} {} \"{}\"\n",
        chunk.at.strftime("%Y-%m-%dT%H:%M:%S%.6fZ"),
        direction_name(chunk.direction),
        chunk.bytes.escape_ascii()
    )
}

/// One pushed record of a console: bytes that went one way, the first of them at `at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// When its first byte went.
    pub at: jiff::Timestamp,
    /// Which way.
    pub direction: Direction,
    /// The bytes.
    pub bytes: Vec<u8>,
}

/// Cuts a console's chunks into records: a record ends after `\n`, after a `\r` going to
/// the board that no `\n` follows in its chunk (what the client typed ends with Enter),
/// when the direction changes, and at [`RECORD_MAX`] bytes; [`Batcher::flush`] ends the
/// pending one (called after [`LINGER`] without more bytes).
#[derive(Debug, Default)]
pub struct Batcher {
    pending: Option<Record>,
}

impl Batcher {
    /// Adds `bytes` that went `direction` at `at`; the records they end go to `out`.
    pub fn push(
        &mut self,
        at: jiff::Timestamp,
        direction: Direction,
        bytes: &[u8],
        out: &mut Vec<Record>,
    ) {
        if self
            .pending
            .as_ref()
            .is_some_and(|p| p.direction != direction)
        {
            self.flush(out);
        }
        for (i, &b) in bytes.iter().enumerate() {
            let p = self.pending.get_or_insert_with(|| Record {
                at,
                direction,
                bytes: Vec::new(),
            });
            p.bytes.push(b);
            let ends = b == b'\n'
                || (b == b'\r'
                    && direction == Direction::ClientToBoard
                    && bytes.get(i + 1) != Some(&b'\n'));
            if ends || p.bytes.len() >= RECORD_MAX {
                self.flush(out);
            }
        }
    }

    /// Ends the pending record, if any.
    pub fn flush(&mut self, out: &mut Vec<Record>) {
        out.extend(self.pending.take());
    }

    /// Whether bytes wait for the end of their record.
    pub fn is_pending(&self) -> bool {
        self.pending.is_some()
    }
}

/// A console's records going to the controller.
struct ConsolePush {
    telemetry: Arc<LeaseTelemetry>,
    console: String,
}

impl ConsolePush {
    fn send(&self, records: &mut Vec<Record>) {
        for r in records.drain(..) {
            self.telemetry.console(
                &self.console,
                direction_name(r.direction),
                SystemTime::from(r.at),
                &r.bytes.escape_ascii().to_string(),
            );
        }
    }
}

/// A transcript's file, to be opened by [`record_console`].
struct TranscriptFile {
    path: PathBuf,
    header: String,
    max_bytes: u64,
    dropped: Arc<AtomicU64>,
}

/// The open file of a transcript.
struct OpenTranscript {
    file: tokio::fs::File,
    path: PathBuf,
    size: u64,
    full: bool,
    max_bytes: u64,
    dropped: Arc<AtomicU64>,
    pending: String,
}

impl TranscriptFile {
    async fn open(self) -> Option<OpenTranscript> {
        let file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .await;
        let file = match file {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(
                    "console transcript {}: cannot open: {e}",
                    self.path.display()
                );
                return None;
            }
        };
        let size = file.metadata().await.map(|m| m.len()).unwrap_or(0);
        Some(OpenTranscript {
            file,
            path: self.path,
            size,
            full: size >= self.max_bytes,
            max_bytes: self.max_bytes,
            dropped: self.dropped,
            pending: if size == 0 {
                self.header
            } else {
                String::new()
            },
        })
    }
}

impl OpenTranscript {
    /// Appends `chunks` (up to the cap); `Err` when the file cannot be written.
    async fn write(&mut self, chunks: &[Chunk]) -> Result<(), ()> {
        if self.full {
            return Ok(());
        }
        let lost = self.dropped.swap(0, Ordering::Relaxed);
        if lost > 0 {
            self.pending.push_str(&format!(
                "# {lost} chunks not recorded (the transcript fell behind)\n"
            ));
        }
        for c in chunks {
            self.pending.push_str(&line(c));
        }
        let max_bytes = self.max_bytes;
        if self.size + self.pending.len() as u64 > max_bytes {
            let room = usize::try_from(max_bytes.saturating_sub(self.size)).unwrap_or(usize::MAX);
            let mut cut = room.min(self.pending.len());
            while !self.pending.is_char_boundary(cut) {
                cut -= 1;
            }
            self.pending.truncate(cut);
            self.pending.push_str(&format!(
                "\n# transcript cut: it reached its cap of {max_bytes} bytes (maxBytes)\n"
            ));
            self.full = true;
        }
        if let Err(e) = self.file.write_all(self.pending.as_bytes()).await {
            tracing::warn!(
                "console transcript {}: cannot write: {e}",
                self.path.display()
            );
            return Err(());
        }
        self.size += self.pending.len() as u64;
        self.pending.clear();
        Ok(())
    }
}

/// Takes the queued chunks until the recorder is dropped: appends them to the file (up to
/// its cap) and pushes them as records when `push` is set.
async fn record_console(
    mut rx: mpsc::Receiver<Chunk>,
    file: TranscriptFile,
    push: Option<ConsolePush>,
) {
    let mut file = file.open().await;
    let mut batcher = Batcher::default();
    let mut records = Vec::new();
    let mut chunks: Vec<Chunk> = Vec::new();
    loop {
        let first = if batcher.is_pending() {
            match tokio::time::timeout(LINGER, rx.recv()).await {
                Ok(c) => c,
                Err(_) => {
                    batcher.flush(&mut records);
                    if let Some(p) = &push {
                        p.send(&mut records);
                    }
                    continue;
                }
            }
        } else {
            rx.recv().await
        };
        let Some(first) = first else { break };
        // Take what else is queued now, and write it in one go.
        let mut bytes = first.bytes.len();
        chunks.push(first);
        while bytes < 64 * 1024 {
            match rx.try_recv() {
                Ok(c) => {
                    bytes += c.bytes.len();
                    chunks.push(c);
                }
                Err(_) => break,
            }
        }
        if let Some(p) = &push {
            for c in &chunks {
                batcher.push(c.at, c.direction, &c.bytes, &mut records);
            }
            p.send(&mut records);
        }
        if let Some(f) = &mut file
            && f.write(&chunks).await.is_err()
        {
            file = None;
        }
        chunks.clear();
    }
    batcher.flush(&mut records);
    if let Some(p) = &push {
        p.send(&mut records);
    }
    if let Some(f) = &mut file {
        let _ = f.file.flush().await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// `board` with a `console` child, as uuids stay fixed for one process's tree.
    fn tree() -> DriverNode {
        static TREE: std::sync::OnceLock<DriverNode> = std::sync::OnceLock::new();
        TREE.get_or_init(|| {
            let console = DriverNode::new(Arc::new(jumpstarter_drivers::PySerial::new(
                jumpstarter_drivers::SerialUrl::Loop,
            )));
            let mut board = DriverNode::new(Arc::new(jumpstarter_drivers::PySerial::new(
                jumpstarter_drivers::SerialUrl::Loop,
            )));
            board.children.push(("console".into(), console));
            let mut root = DriverNode::new(Arc::new(jumpstarter_drivers::PySerial::new(
                jumpstarter_drivers::SerialUrl::Loop,
            )));
            root.children.push(("board".into(), board));
            root
        })
        .clone()
    }

    fn store(dir: &Path, max_bytes: u64, keep_leases: usize) -> TranscriptStore {
        TranscriptStore::new(ConsoleTranscripts {
            dir: dir.to_path_buf(),
            max_bytes,
            keep_leases,
            max_age_days: 30,
        })
    }

    /// Waits (bounded) until `path` contains `want`.
    async fn wait_for(path: &Path, want: &str) -> String {
        for _ in 0..500 {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            if text.contains(want) {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "{} never had {want:?}: {:?}",
            path.display(),
            std::fs::read_to_string(path)
        );
    }

    #[tokio::test]
    async fn both_directions_are_recorded_with_times_and_escaped() {
        let tmp = tempfile::tempdir().unwrap();
        let lease = store(tmp.path(), 1 << 20, 5)
            .for_lease("lease-1", "alice", &tree(), None)
            .unwrap();
        let console = tree().children[0].1.children[0].1.uuid;
        let rec = lease.recorder(Some(console), "PySerial").unwrap();
        rec.record(Direction::BoardToClient, b"login: \x1b[0m\r\n");
        rec.record(Direction::ClientToBoard, b"root\r");
        drop(rec);
        let path = tmp.path().join("lease-1/board.console.log");
        let text = wait_for(&path, "client->board").await;
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "# console board.console, lease lease-1, client alice"
        );
        assert!(
            lines[1].ends_with(" board->client \"login: \\x1b[0m\\r\\n\""),
            "{}",
            lines[1]
        );
        assert!(
            lines[2].ends_with(" client->board \"root\\r\""),
            "{}",
            lines[2]
        );
        let stamp = lines[1].split(' ').next().unwrap();
        assert!(
            stamp.parse::<jiff::Timestamp>().is_ok(),
            "not a timestamp: {stamp}"
        );
    }

    #[tokio::test]
    async fn a_transcript_stops_at_its_cap_and_says_so() {
        let tmp = tempfile::tempdir().unwrap();
        let lease = store(tmp.path(), 2000, 5)
            .for_lease("l", "c", &tree(), None)
            .unwrap();
        // A driver the tree does not know is named after its type.
        let rec = lease.recorder(None, "serial").unwrap();
        for _ in 0..200 {
            rec.record(Direction::BoardToClient, &[b'x'; 100]);
        }
        drop(rec);
        let path = tmp.path().join("l/serial.log");
        let text = wait_for(&path, "transcript cut").await;
        assert!(text.len() < 2200, "{}", text.len());
        // A later recorder of the same lease (the console reopened) adds nothing more.
        let rec = lease.recorder(None, "serial").unwrap();
        rec.record(Direction::BoardToClient, b"more");
        drop(rec);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    }

    fn records(chunks: &[(Direction, &[u8])]) -> Vec<(Direction, String)> {
        let mut b = Batcher::default();
        let mut out = Vec::new();
        for (d, bytes) in chunks {
            b.push(jiff::Timestamp::now(), *d, bytes, &mut out);
        }
        b.flush(&mut out);
        out.into_iter()
            .map(|r| (r.direction, r.bytes.escape_ascii().to_string()))
            .collect()
    }

    #[test]
    fn the_batcher_cuts_lines_not_bytes() {
        use Direction::{BoardToClient as B, ClientToBoard as C};
        // Typed a byte at a time: one record up to Enter.
        let typed: Vec<(Direction, &[u8])> = b"root\r"
            .iter()
            .map(|b| (C, std::slice::from_ref(b)))
            .collect();
        assert_eq!(records(&typed), vec![(C, "root\\r".to_string())]);
        // Output cut at line ends; a prompt without one stays pending until flushed.
        assert_eq!(
            records(&[(B, b"U-Boot\r\nboot"), (B, b"ing\r\nlogin: ")]),
            vec![
                (B, "U-Boot\\r\\n".to_string()),
                (B, "booting\\r\\n".to_string()),
                (B, "login: ".to_string())
            ]
        );
        // A change of direction ends the pending record; \r\n to the board is one end.
        assert_eq!(
            records(&[(B, b"login: "), (C, b"ls\r\n")]),
            vec![(B, "login: ".to_string()), (C, "ls\\r\\n".to_string())]
        );
        // A long line without an end is cut at RECORD_MAX bytes.
        let long = vec![b'x'; RECORD_MAX * 2 + 10];
        let r = records(&[(B, &long)]);
        assert_eq!(
            r.iter().map(|(_, s)| s.len()).collect::<Vec<_>>(),
            [RECORD_MAX, RECORD_MAX, 10]
        );
    }

    #[test]
    fn a_record_has_the_time_of_its_first_byte() {
        let mut b = Batcher::default();
        let mut out = Vec::new();
        let t0 = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let t1 = jiff::Timestamp::from_second(1_800_000_001).unwrap();
        b.push(t0, Direction::BoardToClient, b"ab", &mut out);
        b.push(t1, Direction::BoardToClient, b"c\n", &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].at, t0);
        assert!(!b.is_pending());
    }

    #[tokio::test]
    async fn records_are_pushed_as_console_entries_and_partial_lines_after_the_linger() {
        let tmp = tempfile::tempdir().unwrap();
        let (sink, mut rx) = crate::telemetry::TelemetrySink::channel(64);
        let telemetry = Arc::new(LeaseTelemetry::new(
            sink,
            "lease-1",
            "alice",
            "board",
            "ns",
            &std::collections::BTreeMap::new(),
        ));
        let lease = store(tmp.path(), 1 << 20, 5)
            .for_lease("lease-1", "alice", &tree(), Some(telemetry))
            .unwrap();
        let console = tree().children[0].1.children[0].1.uuid;
        let rec = lease.recorder(Some(console), "PySerial").unwrap();
        rec.record(Direction::BoardToClient, b"hello\r\nlogin: ");
        // The prompt goes after the linger, with the recorder still open.
        let mut got = Vec::new();
        for _ in 0..2 {
            let e = tokio::time::timeout(Duration::from_secs(30), rx.recv())
                .await
                .unwrap()
                .unwrap();
            got.push(e);
        }
        rec.record(Direction::ClientToBoard, b"root\r");
        drop(rec);
        got.push(
            tokio::time::timeout(Duration::from_secs(30), rx.recv())
                .await
                .unwrap()
                .unwrap(),
        );
        let seen: Vec<(&str, &str, &str)> = got
            .iter()
            .map(|e| {
                assert_eq!(e.extra_fields["stream"], "console");
                assert_eq!(e.extra_fields["console"], "board.console");
                assert_eq!(e.lease, "lease-1");
                (
                    e.extra_fields["direction"].as_str(),
                    e.message.as_str(),
                    e.component.as_str(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("board->client", "hello\\r\\n", "exporter"),
                ("board->client", "login: ", "exporter"),
                ("client->board", "root\\r", "exporter"),
            ]
        );
        // The file has them too.
        wait_for(
            &tmp.path().join("lease-1/board.console.log"),
            "client->board",
        )
        .await;
    }

    #[test]
    fn retention_keeps_the_newest_leases_and_drops_the_old() {
        let tmp = tempfile::tempdir().unwrap();
        let s = store(tmp.path(), 1 << 20, 2);
        for (i, name) in ["a", "b", "c"].iter().enumerate() {
            let d = tmp.path().join(name);
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join("serial.log"), "x").unwrap();
            let t = SystemTime::now() - Duration::from_secs(3600 * (3 - i as u64));
            std::fs::File::open(&d).unwrap().set_modified(t).unwrap();
        }
        let removed = s.prune(SystemTime::now());
        assert_eq!(removed, vec![tmp.path().join("a")]);
        // 31 days later all are too old.
        let later = SystemTime::now() + Duration::from_secs(31 * 86_400);
        let mut removed = s.prune(later);
        removed.sort();
        assert_eq!(removed, vec![tmp.path().join("b"), tmp.path().join("c")]);
    }

    #[test]
    fn names_stay_one_path_component() {
        assert_eq!(file_name("../etc"), "_.._etc");
        assert_eq!(file_name("a/b"), "a_b");
        assert_eq!(file_name(""), "_");
        assert_eq!(file_name("lease-1"), "lease-1");
    }
}
