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
use tokio::{io::AsyncWriteExt, sync::mpsc};
use uuid::Uuid;

/// Chunks queued for a transcript's writer before new ones are dropped (and counted).
const QUEUE: usize = 1024;

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
    pub fn for_lease(
        &self,
        lease: &str,
        client: &str,
        tree: &DriverNode,
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
        rt.spawn(write_transcript(
            path,
            header,
            self.max_bytes,
            rx,
            dropped.clone(),
        ));
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

/// One transcript line.
fn line(chunk: &Chunk) -> String {
    let dir = match chunk.direction {
        Direction::BoardToClient => "board->client",
        Direction::ClientToBoard => "client->board",
    };
    format!(
        "{} {dir} \"{}\"\n",
        chunk.at.strftime("%Y-%m-%dT%H:%M:%S%.6fZ"),
        chunk.bytes.escape_ascii()
    )
}

/// Appends the queued chunks to `path` until the recorder is dropped, up to `max_bytes`.
async fn write_transcript(
    path: PathBuf,
    header: String,
    max_bytes: u64,
    mut rx: mpsc::Receiver<Chunk>,
    dropped: Arc<AtomicU64>,
) {
    let file = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .await;
    let mut file = match file {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!("console transcript {}: cannot open: {e}", path.display());
            return;
        }
    };
    let mut size = file.metadata().await.map(|m| m.len()).unwrap_or(0);
    let mut full = size >= max_bytes;
    let mut pending = if size == 0 { header } else { String::new() };
    while let Some(chunk) = rx.recv().await {
        if full {
            continue;
        }
        let lost = dropped.swap(0, Ordering::Relaxed);
        if lost > 0 {
            pending.push_str(&format!(
                "# {lost} chunks not recorded (the transcript fell behind)\n"
            ));
        }
        pending.push_str(&line(&chunk));
        // Take what else is queued now, and write it in one go.
        while pending.len() < 64 * 1024 {
            match rx.try_recv() {
                Ok(c) => pending.push_str(&line(&c)),
                Err(_) => break,
            }
        }
        if size + pending.len() as u64 > max_bytes {
            let room = usize::try_from(max_bytes.saturating_sub(size)).unwrap_or(usize::MAX);
            let mut cut = room.min(pending.len());
            while !pending.is_char_boundary(cut) {
                cut -= 1;
            }
            pending.truncate(cut);
            pending.push_str(&format!(
                "\n# transcript cut: it reached its cap of {max_bytes} bytes (maxBytes)\n"
            ));
            full = true;
        }
        if let Err(e) = file.write_all(pending.as_bytes()).await {
            tracing::warn!("console transcript {}: cannot write: {e}", path.display());
            return;
        }
        size += pending.len() as u64;
        pending.clear();
    }
    let _ = file.flush().await;
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
            .for_lease("lease-1", "alice", &tree())
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
            .for_lease("l", "c", &tree())
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
