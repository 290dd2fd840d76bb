//! One console, many clients: a writer and any number of read-only observers of a byte
//! stream whose physical end is exclusive (a serial port, a pty, a console server's socket).
//!
//! [`ConsoleFanout`] opens the physical stream (the *source*) when its first client arrives
//! and closes it when its last one leaves. One task reads the source and hands every chunk
//! to each client's buffer:
//!
//! - the **writer** (`connect`, what upstream 0.9.0 clients open) reads losslessly, as it
//!   did before observers existed: when its buffer is full the reading task waits for it,
//!   so a slow writer slows the board's output as a direct connection would; it writes to
//!   the source. At most one writer at a time: another `connect` waits a moment for the
//!   seat ([`FanoutOptions::seat_grace`], for a client that closes and reopens at once),
//!   then is refused with upstream's "Console in use. Use --observe or release-console.";
//! - each **observer** (`observe`) first gets the scrollback (the last
//!   [`SCROLLBACK_BYTES`] the source produced), then live bytes, through a bounded buffer
//!   ([`OBSERVER_BUFFER_BYTES`]). When an observer does not read, its oldest bytes are
//!   dropped and it reads a marker `[N bytes dropped]` where they were: an observer never
//!   slows the writer, the reading task or the board. Its writes fail (read-only).
//!   An observer's reads are coalesced: it is woken when its buffer reaches
//!   [`OBSERVER_WAKE_BYTES`], or [`OBSERVER_LINGER`] after its first unread byte, so that
//!   under a fast console each observer delivers a few large frames rather than one per
//!   chunk the source produced (each frame an observer sends costs CPU the writer shares).
//!   Each observer also has a delivery budget ([`FanoutOptions::observer_rate`], by default
//!   [`OBSERVER_BYTES_PER_SECOND`], far above any real console): past it, an observer takes
//!   the newest bytes its budget allows and the older ones count as dropped (the same
//!   marker), so that observers together cannot take more than a bounded share of the CPU
//!   the writer and the board need. A bounded burst (its buffer's worth) goes at once.
//!
//! [`ConsoleFanout::release_console`] takes the seat from the writer (its later writes fail,
//! it reads on as an observer would) so that someone else may `connect`. The source ending
//! (end of file or an error, a USB adapter unplugged) ends every client's stream the same
//! way; the next client opens the source afresh.
//!
//! A [`ConsoleRecorder`] given with the first client of a source sees every byte both ways
//! (a console transcript); it must not block.

use std::{
    collections::{HashMap, VecDeque},
    future::Future,
    io,
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard, Weak},
    task::{Context, Poll, Waker},
    time::Duration,
};

use bytes::{Buf, Bytes};
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf, ReadHalf, WriteHalf};

use super::{
    error::DriverError,
    model::BoxDuplex,
    transcript::{ConsoleRecorder, Direction},
};

/// Bytes of console output kept for observers that join later (upstream's 64 KB).
pub const SCROLLBACK_BYTES: usize = 64 * 1024;

/// Bytes buffered for each observer before its oldest are dropped.
pub const OBSERVER_BUFFER_BYTES: usize = 64 * 1024;

/// Bytes in an observer's buffer that wake its reader at once (fewer wait for
/// [`OBSERVER_LINGER`]).
pub const OBSERVER_WAKE_BYTES: usize = 32 * 1024;

/// How long an observer's first unread bytes wait for more before it reads them anyway
/// (a human watching a console does not see 5 ms; a fast console's observers send far
/// fewer, larger frames).
pub const OBSERVER_LINGER: Duration = Duration::from_millis(5);

/// Bytes per second each observer may receive at most (4 MiB/s, ten times a 4 Mbaud UART's
/// 400 KB/s): beyond it the observer's oldest bytes are dropped.
pub const OBSERVER_BYTES_PER_SECOND: u64 = 4 * 1024 * 1024;

/// The longest a throttled observer waits before it reads again (at a low budget it takes
/// what it may every so often rather than waiting for a full batch).
const OBSERVER_THROTTLE_MAX_WAIT: Duration = Duration::from_millis(100);

/// Bytes buffered for the writer before the reading task waits for it.
pub const WRITER_BUFFER_BYTES: usize = 64 * 1024;

/// Upstream's message for a `connect` while another client writes.
pub const CONSOLE_IN_USE: &str = "Console in use. Use --observe or release-console.";

/// What the source's reading task reads at a time.
const READ_CHUNK: usize = 16 * 1024;

/// Sizes and timings of a [`ConsoleFanout`].
#[derive(Debug, Clone, Copy)]
pub struct FanoutOptions {
    /// Bytes of scrollback replayed to an observer that joins.
    pub scrollback: usize,
    /// Bytes buffered per observer before its oldest are dropped.
    pub observer_buffer: usize,
    /// Bytes in an observer's buffer that wake it at once; fewer wait up to `linger`.
    pub observer_wake: usize,
    /// How long an observer's first unread bytes wait for more (zero: read at once).
    pub linger: Duration,
    /// Bytes per second each observer (and a writer whose seat was taken) may receive at
    /// most, after a first burst of `observer_buffer` bytes; what it cannot take is dropped,
    /// oldest first, and marked. At least 1.
    pub observer_rate: u64,
    /// Bytes buffered for the writer before the reading task waits for it.
    pub writer_buffer: usize,
    /// How long a `connect` waits for the writer's seat before it is refused.
    pub seat_grace: Duration,
}

impl Default for FanoutOptions {
    fn default() -> Self {
        Self {
            scrollback: SCROLLBACK_BYTES,
            observer_buffer: OBSERVER_BUFFER_BYTES,
            observer_wake: OBSERVER_WAKE_BYTES,
            linger: OBSERVER_LINGER,
            observer_rate: OBSERVER_BYTES_PER_SECOND,
            writer_buffer: WRITER_BUFFER_BYTES,
            seat_grace: Duration::from_secs(2),
        }
    }
}

/// Who uses a console, as `console_status` reports it (upstream's field names).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConsoleStatus {
    /// The writer (`connection N`), if one holds the seat.
    pub write_token_holder: Option<String>,
    /// Clients reading without the seat.
    pub observer_count: usize,
    /// Every client, the writer included.
    pub total_clients: usize,
    /// Whether the source is open and read.
    pub reader_running: bool,
    /// Bytes of scrollback an observer joining now would get.
    pub scrollback_bytes: usize,
}

/// A console's writer and observers over one exclusive source (see the module docs).
pub struct ConsoleFanout {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ConsoleFanout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsoleFanout")
            .field("status", &self.status())
            .finish()
    }
}

impl Default for ConsoleFanout {
    fn default() -> Self {
        Self::new(FanoutOptions::default())
    }
}

struct Shared {
    opts: FanoutOptions,
    state: Mutex<State>,
    /// Held while a source is opened, so that two first clients open it once.
    opening: tokio::sync::Mutex<()>,
    /// Woken when the writer's seat may have become free.
    seat: tokio::sync::Notify,
}

#[derive(Default)]
struct State {
    source: Option<Source>,
    generation: u64,
    writer: Option<u64>,
    clients: HashMap<u64, Arc<ClientBuf>>,
    scrollback: VecDeque<Bytes>,
    scrollback_bytes: usize,
    next_id: u64,
}

struct Source {
    generation: u64,
    write: Arc<Mutex<WriteHalf<BoxDuplex>>>,
    recorder: Option<Arc<dyn ConsoleRecorder>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Source {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// The source's write half and its recorder, as a writer's write uses them.
type WriteEnd = (
    Arc<Mutex<WriteHalf<BoxDuplex>>>,
    Option<Arc<dyn ConsoleRecorder>>,
);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl ConsoleFanout {
    /// A fan-out with no source open yet.
    pub fn new(opts: FanoutOptions) -> Self {
        Self {
            shared: Arc::new(Shared {
                opts,
                state: Mutex::new(State::default()),
                opening: tokio::sync::Mutex::new(()),
                seat: tokio::sync::Notify::new(),
            }),
        }
    }

    /// Attaches the writer: takes the seat (waiting [`FanoutOptions::seat_grace`] for it at
    /// most, then [`DriverError::NotReady`] with [`CONSOLE_IN_USE`]), opening the source
    /// with `open` if no client has it open. The writer gets no scrollback: it reads what
    /// the source produces from now on, as a direct connection would.
    pub async fn connect<F, Fut>(
        &self,
        open: F,
        recorder: Option<Arc<dyn ConsoleRecorder>>,
    ) -> Result<ConsoleStream, DriverError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<BoxDuplex, DriverError>>,
    {
        let deadline = tokio::time::Instant::now() + self.shared.opts.seat_grace;
        loop {
            let freed = self.shared.seat.notified();
            if lock(&self.shared.state).writer.is_none() {
                break;
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return Err(DriverError::NotReady(CONSOLE_IN_USE.into()));
            }
        }
        self.attach(Role::Writer, open, recorder).await
    }

    /// Attaches an observer: the scrollback, then live bytes; writes fail. Opens the source
    /// with `open` if no client has it open.
    pub async fn observe<F, Fut>(
        &self,
        open: F,
        recorder: Option<Arc<dyn ConsoleRecorder>>,
    ) -> Result<ConsoleStream, DriverError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<BoxDuplex, DriverError>>,
    {
        self.attach(Role::Observer, open, recorder).await
    }

    async fn attach<F, Fut>(
        &self,
        role: Role,
        open: F,
        recorder: Option<Arc<dyn ConsoleRecorder>>,
    ) -> Result<ConsoleStream, DriverError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<BoxDuplex, DriverError>>,
    {
        let _opening = self.shared.opening.lock().await;
        // Opens the source unless it is open; checked again under the state's lock, as the
        // last client may leave (and close it) meanwhile.
        let mut open = Some(open);
        let mut opened: Option<BoxDuplex> = None;
        let mut st = loop {
            if let Some(st) = self.state_if_open(opened.is_some()) {
                break st;
            }
            let Some(open) = open.take() else {
                return Err(DriverError::failed(
                    "the console closed while it was opened",
                ));
            };
            opened = Some(open().await?);
        };
        if role == Role::Writer && st.writer.is_some() {
            // Taken while the source opened (only by another connect racing this one).
            return Err(DriverError::NotReady(CONSOLE_IN_USE.into()));
        }
        if let Some(io) = opened.filter(|_| st.source.is_none()) {
            st.generation += 1;
            let generation = st.generation;
            let (read, write) = tokio::io::split(io);
            let reader = tokio::spawn(read_source(Arc::downgrade(&self.shared), generation, read));
            st.source = Some(Source {
                generation,
                write: Arc::new(Mutex::new(write)),
                recorder,
                reader,
            });
        }
        st.next_id += 1;
        let id = st.next_id;
        let buf = Arc::new(ClientBuf::new(match role {
            Role::Writer => BufState::new(self.shared.opts.writer_buffer, true),
            Role::Observer => {
                let mut b = BufState::new(self.shared.opts.observer_buffer, false);
                b.wake_at = self.shared.opts.observer_wake.clamp(1, b.cap);
                b
            }
        }));
        if role == Role::Observer {
            let mut b = lock(&buf.st);
            for chunk in &st.scrollback {
                b.push_lossy(chunk.clone());
            }
        } else {
            st.writer = Some(id);
        }
        st.clients.insert(id, buf.clone());
        Ok(ConsoleStream {
            shared: self.shared.clone(),
            id,
            role,
            buf,
            linger: None,
            budget: Budget::new(&self.shared.opts),
            throttle: None,
        })
    }

    /// The state, locked, if the source is open or `opened` (one was just opened).
    fn state_if_open(&self, opened: bool) -> Option<MutexGuard<'_, State>> {
        let st = lock(&self.shared.state);
        (st.source.is_some() || opened).then_some(st)
    }

    /// The sizes and timings it was made with.
    pub fn options(&self) -> FanoutOptions {
        self.shared.opts
    }

    /// Takes the seat from the writer, if any: its later writes fail, it reads on without
    /// holding the board back, and is told `[write token revoked]`. Returns whether there
    /// was a writer.
    pub fn release_console(&self) -> bool {
        let mut st = lock(&self.shared.state);
        let Some(id) = st.writer.take() else {
            return false;
        };
        if let Some(buf) = st.clients.get(&id) {
            let mut b = lock(&buf.st);
            b.lossless = false;
            b.push_lossy(Bytes::from_static(b"\r\n[write token revoked]\r\n"));
        }
        drop(st);
        self.shared.seat.notify_waiters();
        true
    }

    /// Who uses the console now.
    pub fn status(&self) -> ConsoleStatus {
        let st = lock(&self.shared.state);
        ConsoleStatus {
            write_token_holder: st.writer.map(|id| format!("connection {id}")),
            observer_count: st.clients.len() - usize::from(st.writer.is_some()),
            total_clients: st.clients.len(),
            reader_running: st.source.is_some(),
            scrollback_bytes: st.scrollback_bytes,
        }
    }

    /// Ends every client's stream (as an end of file) and closes the source; the scrollback
    /// stays. The next client opens the source afresh.
    pub fn close_all(&self) {
        let source = {
            let mut st = lock(&self.shared.state);
            st.end_clients(None);
            st.source.take()
        };
        drop(source);
        self.shared.seat.notify_waiters();
    }

    /// [`ConsoleFanout::close_all`], and forgets the scrollback (a session ended: the next
    /// lease's observers see nothing of this one's).
    pub fn reset(&self) {
        self.close_all();
        let mut st = lock(&self.shared.state);
        st.scrollback.clear();
        st.scrollback_bytes = 0;
    }
}

impl State {
    /// Ends every client with `error` (or an end of file) and forgets them.
    fn end_clients(&mut self, error: Option<&str>) {
        for (_, buf) in self.clients.drain() {
            let mut b = lock(&buf.st);
            b.end = Some(error.map(str::to_string));
            b.wake_all();
        }
        self.writer = None;
    }

    fn keep_scrollback(&mut self, chunk: &Bytes, limit: usize) {
        self.scrollback.push_back(chunk.clone());
        self.scrollback_bytes += chunk.len();
        while self.scrollback_bytes > limit {
            let Some(front) = self.scrollback.front_mut() else {
                break;
            };
            let excess = self.scrollback_bytes - limit;
            if front.len() <= excess {
                self.scrollback_bytes -= front.len();
                self.scrollback.pop_front();
            } else {
                front.advance(excess);
                self.scrollback_bytes -= excess;
            }
        }
    }
}

/// The reading task of source `generation`: every chunk to the scrollback, the recorder
/// and each client; ends every client when the source ends.
async fn read_source(shared: Weak<Shared>, generation: u64, mut read: ReadHalf<BoxDuplex>) {
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let r = read.read(&mut buf).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let n = match r {
            Ok(0) => return shared.source_ended(generation, None),
            Ok(n) => n,
            Err(e) => return shared.source_ended(generation, Some(&e.to_string())),
        };
        let chunk = Bytes::copy_from_slice(&buf[..n]);
        let writer = {
            let mut st = lock(&shared.state);
            if st.source.as_ref().map(|s| s.generation) != Some(generation) {
                return;
            }
            st.keep_scrollback(&chunk, shared.opts.scrollback);
            if let Some(rec) = st.source.as_ref().and_then(|s| s.recorder.as_ref()) {
                rec.record(Direction::BoardToClient, &chunk);
            }
            let mut writer = None;
            for buf in st.clients.values() {
                let mut b = lock(&buf.st);
                if b.lossless {
                    writer = Some(buf.clone());
                } else {
                    b.push_lossy(chunk.clone());
                }
            }
            writer
        };
        drop(shared);
        if let Some(w) = writer {
            // Only the writer may hold the board back, as a direct connection would.
            std::future::poll_fn(|cx| w.push_waiting(cx, &chunk)).await;
        }
    }
}

impl Shared {
    fn source_ended(&self, generation: u64, error: Option<&str>) {
        let source = {
            let mut st = lock(&self.state);
            if st.source.as_ref().map(|s| s.generation) != Some(generation) {
                return;
            }
            st.end_clients(error);
            st.source.take()
        };
        // Dropping it aborts this very task: after the lock is released, and last.
        self.seat.notify_waiters();
        drop(source);
    }

    fn detach(&self, id: u64) {
        let source = {
            let mut st = lock(&self.state);
            if let Some(buf) = st.clients.remove(&id) {
                let mut b = lock(&buf.st);
                b.end = Some(None);
                b.wake_all();
            }
            if st.writer == Some(id) {
                st.writer = None;
            }
            if st.clients.is_empty() {
                st.source.take()
            } else {
                None
            }
        };
        self.seat.notify_waiters();
        drop(source);
    }
}

/// One client's buffer of console output.
struct ClientBuf {
    st: Mutex<BufState>,
}

struct BufState {
    chunks: VecDeque<Bytes>,
    bytes: usize,
    cap: usize,
    /// The writer's: the reading task waits for room instead of dropping.
    lossless: bool,
    /// Bytes dropped since the client last read (a marker says so before the next bytes).
    dropped: u64,
    /// `Some(None)`: ended; `Some(Some(e))`: ended by the source's error `e`.
    end: Option<Option<String>>,
    /// Buffered bytes that wake the reader at once; fewer wake it only when they arrive in
    /// an empty buffer (to start its linger). 1 for the writer: every chunk wakes it.
    wake_at: usize,
    read_waker: Option<Waker>,
    space_waker: Option<Waker>,
}

impl BufState {
    fn new(cap: usize, lossless: bool) -> Self {
        Self {
            chunks: VecDeque::new(),
            bytes: 0,
            cap: cap.max(1),
            lossless,
            dropped: 0,
            end: None,
            wake_at: 1,
            read_waker: None,
            space_waker: None,
        }
    }

    fn wake_all(&mut self) {
        if let Some(w) = self.read_waker.take() {
            w.wake();
        }
        if let Some(w) = self.space_waker.take() {
            w.wake();
        }
    }

    /// Drops the oldest `n` buffered bytes (fewer if there are fewer), counted as dropped.
    fn drop_oldest(&mut self, mut n: usize) {
        while n > 0 {
            let Some(front) = self.chunks.front_mut() else {
                break;
            };
            let cut = n.min(front.len());
            front.advance(cut);
            self.bytes -= cut;
            self.dropped += cut as u64;
            n -= cut;
            if front.is_empty() {
                self.chunks.pop_front();
            }
        }
    }

    /// Appends `chunk`, dropping the oldest bytes beyond the cap (never waits).
    fn push_lossy(&mut self, mut chunk: Bytes) {
        if self.end.is_some() {
            return;
        }
        if chunk.len() > self.cap {
            let cut = chunk.len() - self.cap;
            self.dropped += cut as u64;
            chunk.advance(cut);
        }
        if self.bytes + chunk.len() > self.cap {
            self.drop_oldest(self.bytes + chunk.len() - self.cap);
        }
        let was_empty = self.bytes == 0;
        self.bytes += chunk.len();
        self.chunks.push_back(chunk);
        if (was_empty || self.bytes >= self.wake_at)
            && let Some(w) = self.read_waker.take()
        {
            w.wake();
        }
    }
}

impl ClientBuf {
    fn new(st: BufState) -> Self {
        Self { st: Mutex::new(st) }
    }

    /// Appends `chunk` once there is room (the writer's buffer), or at once when the buffer
    /// drops instead (a revoked writer), or drops it when the client has gone.
    fn push_waiting(&self, cx: &mut Context<'_>, chunk: &Bytes) -> Poll<()> {
        let mut b = lock(&self.st);
        if b.end.is_some() {
            return Poll::Ready(());
        }
        if !b.lossless {
            b.push_lossy(chunk.clone());
            return Poll::Ready(());
        }
        if b.bytes > 0 && b.bytes + chunk.len() > b.cap {
            b.space_waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        b.bytes += chunk.len();
        b.chunks.push_back(chunk.clone());
        if let Some(w) = b.read_waker.take() {
            w.wake();
        }
        Poll::Ready(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Writer,
    Observer,
}

/// A client's end of a [`ConsoleFanout`]: reads the console; writes to it if this is the
/// writer still holding the seat. Dropping it detaches the client (the last one closes the
/// source).
pub struct ConsoleStream {
    shared: Arc<Shared>,
    id: u64,
    role: Role,
    buf: Arc<ClientBuf>,
    /// An observer's wait for more bytes after its first unread ones (see
    /// [`OBSERVER_LINGER`]).
    linger: Option<Pin<Box<tokio::time::Sleep>>>,
    /// What this client may receive now, when it reads lossily (see
    /// [`FanoutOptions::observer_rate`]).
    budget: Budget,
    /// A throttled client's wait for its budget.
    throttle: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// A token bucket: bytes a lossy reader may take now, refilled at the observers' rate up to
/// its buffer's size.
struct Budget {
    /// Bytes it may take now.
    allowance: u64,
    /// Most it may hold (the observer's buffer).
    burst: u64,
    /// Bytes per second it gains.
    rate: u64,
    /// Up to when the allowance was refilled.
    refilled: tokio::time::Instant,
}

impl Budget {
    fn new(opts: &FanoutOptions) -> Self {
        let burst = opts.observer_buffer.max(1) as u64;
        Self {
            allowance: burst,
            burst,
            rate: opts.observer_rate.max(1),
            refilled: tokio::time::Instant::now(),
        }
    }

    /// Adds what the time since the last refill earned (whole bytes; the time of a byte
    /// not yet whole counts towards the next refill).
    fn refill(&mut self, now: tokio::time::Instant) {
        let elapsed = now.saturating_duration_since(self.refilled);
        let earned = u128::from(self.rate) * elapsed.as_nanos() / 1_000_000_000;
        if earned == 0 {
            return;
        }
        if u128::from(self.allowance) + earned >= u128::from(self.burst) {
            self.allowance = self.burst;
            self.refilled = now;
        } else {
            // Below the burst, so it fits in a u64.
            self.allowance += earned as u64;
            let spent = earned * 1_000_000_000 / u128::from(self.rate);
            self.refilled += Duration::from_nanos(u64::try_from(spent).unwrap_or(u64::MAX));
        }
    }

    /// Bytes earned in `d`.
    fn earned_in(&self, d: Duration) -> u64 {
        u64::try_from(u128::from(self.rate) * d.as_nanos() / 1_000_000_000).unwrap_or(u64::MAX)
    }

    /// How long until the allowance reaches `want` bytes (at most `want` = burst).
    fn wait_for(&self, want: u64, now: tokio::time::Instant) -> Duration {
        let missing = want.min(self.burst).saturating_sub(self.allowance);
        let nanos = (u128::from(missing) * 1_000_000_000).div_ceil(u128::from(self.rate));
        let due = self.refilled + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        due.saturating_duration_since(now)
    }
}

impl ConsoleStream {
    /// Whether this stream was opened as an observer.
    pub fn is_observer(&self) -> bool {
        self.role == Role::Observer
    }

    fn source_for_write(&self) -> io::Result<WriteEnd> {
        if self.role == Role::Observer {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "this console connection observes only (read-only)",
            ));
        }
        let st = lock(&self.shared.state);
        if st.writer != Some(self.id) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "write token revoked (release-console)",
            ));
        }
        match &st.source {
            Some(s) => Ok((s.write.clone(), s.recorder.clone())),
            None => Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the console connection was closed",
            )),
        }
    }
}

impl Drop for ConsoleStream {
    fn drop(&mut self) {
        self.shared.detach(self.id);
    }
}

impl AsyncRead for ConsoleStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let mut b = lock(&this.buf.st);
        // An observer with a few unread bytes waits a moment for more (coalesced frames);
        // enough bytes, a marker to tell or the end read at once.
        if b.bytes > 0 && b.bytes < b.wake_at && b.dropped == 0 && b.end.is_none() {
            let linger = this.shared.opts.linger;
            if !linger.is_zero() {
                let sleep = this
                    .linger
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(linger)));
                if sleep.as_mut().poll(cx).is_pending() {
                    b.read_waker = Some(cx.waker().clone());
                    return Poll::Pending;
                }
            }
        }
        this.linger = None;
        if !b.lossless && b.bytes > 0 && b.end.is_none() {
            // A lossy reader takes what its budget allows: once it has enough for a batch
            // (or for what it has), the newest bytes; the older ones count as dropped.
            let budget = &mut this.budget;
            let want = (b.bytes.min(b.wake_at) as u64)
                .min(budget.earned_in(OBSERVER_THROTTLE_MAX_WAIT))
                .max(1);
            loop {
                let now = tokio::time::Instant::now();
                budget.refill(now);
                if budget.allowance >= want {
                    this.throttle = None;
                    break;
                }
                let sleep = this.throttle.get_or_insert_with(|| {
                    Box::pin(tokio::time::sleep(budget.wait_for(want, now)))
                });
                if sleep.as_mut().poll(cx).is_pending() {
                    // The sleep wakes it (not each chunk the reading task adds meanwhile).
                    b.read_waker = None;
                    return Poll::Pending;
                }
                this.throttle = None;
            }
            let allowed = usize::try_from(budget.allowance).unwrap_or(usize::MAX);
            if b.bytes > allowed {
                let excess = b.bytes - allowed;
                b.drop_oldest(excess);
            }
        }
        // Marker bytes are not charged to the budget.
        let mut uncharged = 0;
        if b.dropped > 0 && out.remaining() > 0 {
            let marker = format!("\r\n[{} bytes dropped]\r\n", b.dropped);
            b.dropped = 0;
            let marker = Bytes::from(marker);
            uncharged = marker.len();
            b.bytes += marker.len();
            b.chunks.push_front(marker);
        }
        let mut copied = false;
        while out.remaining() > 0 {
            let Some(front) = b.chunks.front_mut() else {
                break;
            };
            let n = front.len().min(out.remaining());
            out.put_slice(&front[..n]);
            front.advance(n);
            if front.is_empty() {
                b.chunks.pop_front();
            }
            b.bytes -= n;
            let free = n.min(uncharged);
            uncharged -= free;
            if !b.lossless {
                this.budget.allowance = this.budget.allowance.saturating_sub((n - free) as u64);
            }
            copied = true;
        }
        if copied {
            if let Some(w) = b.space_waker.take() {
                w.wake();
            }
            return Poll::Ready(Ok(()));
        }
        match &b.end {
            Some(None) => Poll::Ready(Ok(())),
            Some(Some(e)) => Poll::Ready(Err(io::Error::other(e.clone()))),
            None => {
                b.read_waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl AsyncWrite for ConsoleStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let (write, recorder) = self.source_for_write()?;
        let mut w = lock(&write);
        let r = Pin::new(&mut *w).poll_write(cx, data);
        if let (Poll::Ready(Ok(n)), Some(rec)) = (&r, recorder) {
            rec.record(Direction::ClientToBoard, &data[..*n]);
        }
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.role == Role::Observer {
            return Poll::Ready(Ok(()));
        }
        let (write, _) = self.source_for_write()?;
        let mut w = lock(&write);
        Pin::new(&mut *w).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The writer's end of input is the source's (a `loop://` console then ends, as it
        // did with one client); an observer's or a revoked writer's is nobody's business.
        match self.source_for_write() {
            Ok((write, _)) => {
                let mut w = lock(&write);
                Pin::new(&mut *w).poll_shutdown(cx)
            }
            Err(_) => Poll::Ready(Ok(())),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    use super::*;

    /// A source whose far end (the "board") the test holds.
    fn board() -> (
        DuplexStream,
        impl FnOnce() -> std::future::Ready<Result<BoxDuplex, DriverError>>,
    ) {
        let (near, far) = tokio::io::duplex(1 << 20);
        let open = move || std::future::ready(Ok(Box::new(near) as BoxDuplex));
        (far, open)
    }

    fn never() -> std::future::Ready<Result<BoxDuplex, DriverError>> {
        std::future::ready(Err(DriverError::failed("the source is already open")))
    }

    async fn read_until(s: &mut ConsoleStream, want: &str) -> String {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        tokio::time::timeout(Duration::from_secs(10), async {
            while !String::from_utf8_lossy(&seen).contains(want) {
                let n = s.read(&mut buf).await.unwrap();
                assert!(
                    n > 0,
                    "ended before {want:?}: {:?}",
                    String::from_utf8_lossy(&seen)
                );
                seen.extend_from_slice(&buf[..n]);
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no {want:?} in {:?}", String::from_utf8_lossy(&seen)));
        String::from_utf8_lossy(&seen).into_owned()
    }

    #[tokio::test]
    async fn writer_and_observers_see_the_board_and_only_the_writer_types() {
        let fan = ConsoleFanout::default();
        let (mut far, open) = board();
        let mut writer = fan.connect(open, None).await.unwrap();
        let mut early = fan.observe(never, None).await.unwrap();
        far.write_all(b"login: ").await.unwrap();
        read_until(&mut writer, "login: ").await;
        read_until(&mut early, "login: ").await;
        writer.write_all(b"root\n").await.unwrap();
        let mut got = [0u8; 5];
        far.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"root\n");
        let e = early.write_all(b"rm -rf /\n").await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        // A late observer gets the scrollback first; the writer got none of it again.
        far.write_all(b"# ").await.unwrap();
        read_until(&mut writer, "# ").await;
        let mut late = fan.observe(never, None).await.unwrap();
        assert_eq!(read_until(&mut late, "# ").await, "login: # ");
        let s = fan.status();
        assert_eq!(s.write_token_holder.as_deref(), Some("connection 1"));
        assert_eq!((s.observer_count, s.total_clients), (2, 3));
        assert!(s.reader_running);
        assert_eq!(s.scrollback_bytes, 9);
        // Nothing an observer sent reached the board.
        drop(writer);
        drop(early);
        drop(late);
        let mut rest = Vec::new();
        far.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "{rest:?}");
        assert!(
            !fan.status().reader_running,
            "the last client closed the source"
        );
    }

    #[tokio::test]
    async fn one_writer_at_a_time_until_release_console() {
        let fan = ConsoleFanout::new(FanoutOptions {
            seat_grace: Duration::from_millis(50),
            ..FanoutOptions::default()
        });
        let (mut far, open) = board();
        let mut first = fan.connect(open, None).await.unwrap();
        let e = fan.connect(never, None).await.err().unwrap();
        assert_eq!(e.to_string(), CONSOLE_IN_USE);
        assert_eq!(e.to_status().code(), tonic::Code::FailedPrecondition);
        assert!(fan.release_console());
        assert!(!fan.release_console(), "nobody holds the seat now");
        let mut second = fan.connect(never, None).await.unwrap();
        read_until(&mut first, "[write token revoked]").await;
        let e = first.write_all(b"x").await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        second.write_all(b"y").await.unwrap();
        let mut got = [0u8; 1];
        far.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"y");
        // The revoked writer still reads, as an observer.
        far.write_all(b"both").await.unwrap();
        read_until(&mut first, "both").await;
        read_until(&mut second, "both").await;
        assert_eq!(fan.status().observer_count, 1);
    }

    #[tokio::test]
    async fn a_writer_that_leaves_frees_the_seat_for_a_connect_already_waiting() {
        let fan = Arc::new(ConsoleFanout::new(FanoutOptions {
            seat_grace: Duration::from_secs(30),
            ..FanoutOptions::default()
        }));
        let (_far, open) = board();
        let first = fan.connect(open, None).await.unwrap();
        let _watching = fan.observe(never, None).await.unwrap();
        let waiting = tokio::spawn({
            let fan = fan.clone();
            async move { fan.connect(never, None).await }
        });
        // One turn of this single-threaded runtime: the connect is waiting for the seat.
        tokio::task::yield_now().await;
        assert_eq!(
            fan.status().write_token_holder.as_deref(),
            Some("connection 1")
        );
        drop(first);
        let second = waiting.await.unwrap().unwrap();
        let id = second.id;
        assert_eq!(
            fan.status().write_token_holder,
            Some(format!("connection {id}"))
        );
    }

    #[tokio::test]
    async fn the_scrollback_keeps_the_last_bytes_only() {
        let fan = ConsoleFanout::new(FanoutOptions {
            scrollback: 1000,
            ..FanoutOptions::default()
        });
        let (mut far, open) = board();
        let mut writer = fan.connect(open, None).await.unwrap();
        let mut all = Vec::new();
        for i in 0..500u32 {
            all.extend_from_slice(format!("{i:05}\n").as_bytes());
        }
        far.write_all(&all).await.unwrap();
        read_until(&mut writer, "00499\n").await;
        assert_eq!(fan.status().scrollback_bytes, 1000);
        let mut late = fan.observe(never, None).await.unwrap();
        let mut got = vec![0u8; 1000];
        late.read_exact(&mut got).await.unwrap();
        assert_eq!(got, all[all.len() - 1000..]);
    }

    #[tokio::test]
    async fn a_stalled_observer_drops_its_oldest_bytes_and_never_holds_the_writer() {
        let fan = ConsoleFanout::new(FanoutOptions {
            observer_buffer: 4096,
            ..FanoutOptions::default()
        });
        let (far, open) = board();
        let (mut board_rx, mut board_tx) = tokio::io::split(far);
        let mut writer = fan.connect(open, None).await.unwrap();
        let mut stalled = fan.observe(never, None).await.unwrap();
        // The board echoes; the writer sends 100 times the observer's buffer and reads it
        // all back while the observer reads nothing.
        let echo = tokio::spawn(async move {
            tokio::io::copy(&mut board_rx, &mut board_tx).await.unwrap();
        });
        let total = 100 * 4096;
        let sent: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
        let (mut rx, mut tx) = tokio::io::split(writer);
        let send = {
            let sent = sent.clone();
            tokio::spawn(async move {
                tx.write_all(&sent).await.unwrap();
                tx
            })
        };
        let mut back = vec![0u8; total];
        tokio::time::timeout(Duration::from_secs(20), rx.read_exact(&mut back))
            .await
            .expect("the writer was held back by a stalled observer")
            .unwrap();
        assert_eq!(back, sent, "the writer lost nothing");
        let tx = send.await.unwrap();
        writer = rx.unsplit(tx);
        // The observer kept its buffer's worth of the newest bytes, after a marker.
        let mut buf = vec![0u8; 8192];
        let n = stalled.read(&mut buf).await.unwrap();
        let text = String::from_utf8_lossy(&buf[..n]).into_owned();
        let marker = format!("\r\n[{} bytes dropped]\r\n", total - 4096);
        assert!(text.starts_with(&marker), "{text:?}");
        let mut kept = buf[marker.len()..n].to_vec();
        while kept.len() < 4096 {
            let n = stalled.read(&mut buf).await.unwrap();
            kept.extend_from_slice(&buf[..n]);
        }
        assert_eq!(kept, sent[total - 4096..]);
        drop(writer);
        drop(stalled);
        echo.abort();
    }

    #[tokio::test]
    async fn the_source_ending_ends_every_client_and_the_next_opens_it_afresh() {
        let fan = ConsoleFanout::default();
        let (far, open) = board();
        let mut writer = fan.connect(open, None).await.unwrap();
        let mut obs = fan.observe(never, None).await.unwrap();
        drop(far);
        let mut buf = [0u8; 8];
        assert_eq!(writer.read(&mut buf).await.unwrap(), 0);
        assert_eq!(obs.read(&mut buf).await.unwrap(), 0);
        assert_eq!(fan.status().total_clients, 0);
        let (mut far, open) = board();
        let mut again = fan.connect(open, None).await.unwrap();
        far.write_all(b"new").await.unwrap();
        read_until(&mut again, "new").await;
        // close_all ends it too, and reset forgets the scrollback.
        fan.reset();
        assert_eq!(again.read(&mut buf).await.unwrap(), 0);
        assert_eq!(fan.status().scrollback_bytes, 0);
        let e = fan.connect(never, None).await.err().unwrap();
        assert!(e.to_string().contains("already open"), "{e}");
    }

    /// Counts the wake-ups of a task.
    #[derive(Default)]
    struct Wakes(std::sync::atomic::AtomicUsize);
    impl std::task::Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
    impl Wakes {
        fn count(&self) -> usize {
            self.0.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    /// Waits (bounded) until the reading task has taken `n` bytes in all.
    async fn taken(fan: &ConsoleFanout, n: usize) {
        for _ in 0..10_000 {
            if fan.status().scrollback_bytes >= n {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the reading task never took {n} bytes");
    }

    #[tokio::test]
    async fn an_observer_is_woken_once_per_batch_not_per_chunk() {
        let fan = ConsoleFanout::new(FanoutOptions {
            observer_wake: 100,
            linger: Duration::from_secs(3600),
            ..FanoutOptions::default()
        });
        let (mut far, open) = board();
        let _writer = fan.connect(open, None).await.unwrap();
        let mut obs = fan.observe(never, None).await.unwrap();
        let wakes = Arc::new(Wakes::default());
        let waker = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        let mut buf = [0u8; 256];
        let mut out = ReadBuf::new(&mut buf);
        assert!(Pin::new(&mut obs).poll_read(&mut cx, &mut out).is_pending());
        // The first bytes into an empty buffer wake it (to start its linger)...
        far.write_all(&[b'a'; 10]).await.unwrap();
        taken(&fan, 10).await;
        assert_eq!(wakes.count(), 1);
        assert!(Pin::new(&mut obs).poll_read(&mut cx, &mut out).is_pending());
        // ...the next chunks below the threshold do not...
        for i in 1..9 {
            far.write_all(&[b'b'; 10]).await.unwrap();
            taken(&fan, 10 + 10 * i).await;
        }
        assert_eq!(wakes.count(), 1, "woken per chunk");
        // ...and reaching it does: one read takes the whole batch.
        far.write_all(&[b'c'; 20]).await.unwrap();
        taken(&fan, 110).await;
        assert_eq!(wakes.count(), 2);
        assert!(Pin::new(&mut obs).poll_read(&mut cx, &mut out).is_ready());
        assert_eq!(out.filled().len(), 110);
    }

    /// `n` bytes of numbered lines (`0000000\n`, `0000001\n`, ...): any stretch of them
    /// shows where it came from.
    fn numbered(n: usize) -> Vec<u8> {
        let mut all = Vec::with_capacity(n + 8);
        let mut i = 0u32;
        while all.len() < n {
            all.extend_from_slice(format!("{i:07}\n").as_bytes());
            i += 1;
        }
        all.truncate(n);
        all
    }

    /// Splits what an observer read into the stretches of the source it got, checking that
    /// each is exactly the source's bytes at its place and that each `[N bytes dropped]`
    /// marker says exactly how many were skipped; returns (bytes received, bytes dropped).
    fn check_coherent(read: &[u8], source: &[u8]) -> (usize, usize) {
        let text = read;
        let (mut pos, mut at, mut received, mut dropped) = (0, 0, 0, 0);
        while at < text.len() {
            let rest = &text[at..];
            let next = rest.windows(3).position(|w| w == b"\r\n[");
            let data = &rest[..next.unwrap_or(rest.len())];
            assert_eq!(
                data,
                &source[pos..pos + data.len()],
                "a stretch at byte {pos} of the source is not the source"
            );
            pos += data.len();
            received += data.len();
            at += data.len();
            if next.is_some() {
                let end = at + text[at..].iter().position(|&c| c == b']').unwrap();
                let marker = std::str::from_utf8(&text[at + 3..end]).unwrap();
                let n: usize = marker
                    .strip_suffix(" bytes dropped")
                    .unwrap()
                    .parse()
                    .unwrap();
                assert!(n > 0);
                assert_eq!(&text[end..end + 3], b"]\r\n");
                pos += n;
                dropped += n;
                at = end + 3;
            }
        }
        assert_eq!(
            pos,
            source.len(),
            "the stretches and markers cover the source"
        );
        (received, dropped)
    }

    /// Plays `total` bytes of numbered lines into the board, `per_tick` bytes every `tick`,
    /// with an observer reading all the while (no writer: nothing holds the board back);
    /// returns what the observer read to the end and the source.
    async fn observe_a_board(
        opts: FanoutOptions,
        total: usize,
        per_tick: usize,
        tick: Duration,
    ) -> (Vec<u8>, Vec<u8>) {
        let fan = ConsoleFanout::new(opts);
        let (mut far, open) = board();
        let mut obs = fan.observe(open, None).await.unwrap();
        let source = numbered(total);
        let reader = tokio::spawn(async move {
            let mut read = Vec::new();
            obs.read_to_end(&mut read).await.unwrap();
            read
        });
        for part in source.chunks(per_tick) {
            far.write_all(part).await.unwrap();
            tokio::time::sleep(tick).await;
        }
        drop(far);
        (reader.await.unwrap(), source)
    }

    #[tokio::test(start_paused = true)]
    async fn at_real_console_rates_every_observer_gets_every_byte() {
        // 115200 baud is 11.5 KB/s: 1152 bytes every 100 ms, ten times the 64 KB window.
        let (read, source) = observe_a_board(
            FanoutOptions::default(),
            1152 * 600,
            1152,
            Duration::from_millis(100),
        )
        .await;
        assert_eq!(
            read, source,
            "an observer of a 115200 baud console lost bytes"
        );
        // A 4 Mbaud UART (400 KB/s, 4000 bytes every 10 ms) is still far below the budget.
        let (read, source) = observe_a_board(
            FanoutOptions::default(),
            4000 * 500,
            4000,
            Duration::from_millis(10),
        )
        .await;
        assert_eq!(read, source, "an observer of a 4 Mbaud console lost bytes");
    }

    #[tokio::test(start_paused = true)]
    async fn an_observer_faster_than_its_budget_gets_its_budget_of_newest_bytes_coherently() {
        // 8 KiB every ms (8 MiB/s of the paused clock) for one second, to an observer whose
        // budget is 1 MiB/s (its buffer, 64 KiB, the first burst).
        let opts = FanoutOptions {
            observer_rate: 1 << 20,
            ..FanoutOptions::default()
        };
        let started = tokio::time::Instant::now();
        let total = 8 << 20;
        let (read, source) = observe_a_board(opts, total, 8 << 10, Duration::from_millis(1)).await;
        let seconds = started.elapsed().as_secs_f64();
        let (received, dropped) = check_coherent(&read, &source);
        assert_eq!(received + dropped, total);
        // It received no more than its budget allowed (and its last buffer, which the end
        // delivers whole), and not much less: it was never starved.
        let budget = 64.0 * 1024.0 + seconds * f64::from(1u32 << 20);
        assert!(
            (received as f64) <= budget + 64.0 * 1024.0,
            "received {received} bytes in {seconds} s, budget {budget}"
        );
        assert!(
            (received as f64) >= 0.9 * (budget - 64.0 * 1024.0),
            "received {received} bytes in {seconds} s, budget {budget}"
        );
        // The newest bytes: its last stretch ends with the source's end.
        assert!(read.ends_with(&source[total - 1000..]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttled_observer_reads_large_batches_not_one_per_chunk() {
        // 16 KiB chunks every ms (16 MiB/s, four times the default budget), 1 KiB at a time:
        // the observer reads batches of at least its wake threshold, not one per chunk.
        let fan = ConsoleFanout::default();
        let (mut far, open) = board();
        let mut obs = fan.observe(open, None).await.unwrap();
        let reads = tokio::spawn(async move {
            let mut sizes = Vec::new();
            let mut buf = vec![0u8; 256 * 1024];
            loop {
                let n = obs.read(&mut buf).await.unwrap();
                if n == 0 {
                    return sizes;
                }
                sizes.push(n);
            }
        });
        let chunk = [b'x'; 1024];
        for _ in 0..1000 {
            for _ in 0..16 {
                far.write_all(&chunk).await.unwrap();
                tokio::task::yield_now().await;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(far);
        let sizes = reads.await.unwrap();
        let received: usize = sizes.iter().sum();
        assert!(received < 16 << 20, "everything was delivered: {received}");
        let small = sizes[..sizes.len() - 1]
            .iter()
            .filter(|&&n| n < OBSERVER_WAKE_BYTES)
            .count();
        assert!(
            small <= 1,
            "{small} of {} reads were below {OBSERVER_WAKE_BYTES} bytes: {sizes:?}",
            sizes.len()
        );
    }

    #[derive(Default)]
    struct Tape(Mutex<Vec<(Direction, Vec<u8>)>>);
    impl ConsoleRecorder for Tape {
        fn record(&self, direction: Direction, bytes: &[u8]) {
            lock(&self.0).push((direction, bytes.to_vec()));
        }
    }

    #[tokio::test]
    async fn a_recorder_sees_both_directions() {
        let fan = ConsoleFanout::default();
        let tape = Arc::new(Tape::default());
        let (mut far, open) = board();
        let mut writer = fan
            .connect(open, Some(tape.clone() as Arc<dyn ConsoleRecorder>))
            .await
            .unwrap();
        writer.write_all(b"ls\n").await.unwrap();
        let mut got = [0u8; 3];
        far.read_exact(&mut got).await.unwrap();
        far.write_all(b"bin\n").await.unwrap();
        read_until(&mut writer, "bin\n").await;
        let tape = lock(&tape.0).clone();
        assert_eq!(
            tape,
            vec![
                (Direction::ClientToBoard, b"ls\n".to_vec()),
                (Direction::BoardToClient, b"bin\n".to_vec()),
            ]
        );
    }
}
