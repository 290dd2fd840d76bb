//! Transfer progress: a bar (bytes, rate, ETA) on a terminal, plain lines otherwise.

use std::{
    io::IsTerminal,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use jumpstarter_core::wire::resource::ChunkWrite;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How often plain progress lines are printed.
const PLAIN_EVERY: Duration = Duration::from_secs(2);

enum Sink {
    Hidden,
    Bar(ProgressBar),
    Plain {
        label: String,
        total: Option<u64>,
        done: u64,
        started: Instant,
        last: Instant,
    },
}

/// Reports how many bytes moved. Cheap to clone (shared state).
#[derive(Clone)]
pub struct Progress(Arc<Mutex<Sink>>);

fn human(n: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

impl Progress {
    /// Progress for a transfer of `total` bytes (if known) on stderr: a bar on a terminal,
    /// a line every two seconds otherwise.
    pub fn stderr(label: &str, total: Option<u64>) -> Self {
        let sink = if std::io::stderr().is_terminal() {
            let bar = match total {
                Some(t) => ProgressBar::with_draw_target(Some(t), ProgressDrawTarget::stderr()),
                None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
            };
            style_bar(&bar, total.is_some());
            bar.set_message(label.to_string());
            Sink::Bar(bar)
        } else {
            let now = Instant::now();
            Sink::Plain {
                label: label.to_string(),
                total,
                done: 0,
                started: now,
                last: now,
            }
        };
        Self(Arc::new(Mutex::new(sink)))
    }

    /// No output.
    pub fn hidden() -> Self {
        Self(Arc::new(Mutex::new(Sink::Hidden)))
    }

    /// Whether nothing is shown (so that a client need not ask for a total).
    pub fn is_hidden(&self) -> bool {
        matches!(*self.lock(), Sink::Hidden)
    }

    /// Sets the number of bytes the transfer will move, learnt after it was set up: the
    /// display gains a percentage and an ETA. Zero is ignored: it is what a character
    /// device (or an empty medium about to be dumped) reports, and says nothing useful.
    pub fn set_total(&self, total: u64) {
        if total == 0 {
            return;
        }
        match &mut *self.lock() {
            Sink::Hidden => {}
            Sink::Bar(b) => {
                b.set_length(total);
                style_bar(b, true);
            }
            Sink::Plain { total: t, .. } => *t = Some(total),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sink> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts `n` more bytes.
    pub fn inc(&self, n: u64) {
        let mut g = self.lock();
        match &mut *g {
            Sink::Hidden => {}
            Sink::Bar(b) => b.inc(n),
            Sink::Plain { done, last, .. } => {
                *done += n;
                if last.elapsed() >= PLAIN_EVERY {
                    *last = Instant::now();
                    eprintln!("{}", plain_line(&g));
                }
            }
        }
    }

    /// Ends the display (prints a final line in plain mode).
    pub fn finish(&self) {
        let g = self.lock();
        match &*g {
            Sink::Hidden => {}
            Sink::Bar(b) => b.finish(),
            Sink::Plain { .. } => eprintln!("{}", plain_line(&g)),
        }
    }

    /// Ends the display after a failure.
    pub fn abandon(&self) {
        if let Sink::Bar(b) = &*self.lock() {
            b.abandon();
        }
    }
}

/// A bar with a percentage and an ETA when the total is known, bytes and rate otherwise.
fn style_bar(bar: &ProgressBar, with_total: bool) {
    let template = if with_total {
        "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}"
    } else {
        "{msg} {bytes} {binary_bytes_per_sec} {elapsed}"
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
}

fn plain_line(s: &Sink) -> String {
    let Sink::Plain {
        label,
        total,
        done,
        started,
        ..
    } = s
    else {
        return String::new();
    };
    let secs = started.elapsed().as_secs_f64().max(1e-3);
    let rate = *done as f64 / secs;
    match total {
        Some(t) if *t > 0 => {
            let eta = if rate > 0.0 {
                format!("{:.0}s", (t.saturating_sub(*done)) as f64 / rate)
            } else {
                "?".into()
            };
            format!(
                "{label}: {} / {} ({:.0}%), {}/s, ETA {eta}",
                human(*done as f64),
                human(*t as f64),
                *done as f64 * 100.0 / *t as f64,
                human(rate)
            )
        }
        _ => format!("{label}: {}, {}/s", human(*done as f64), human(rate)),
    }
}

/// Counts the bytes read through it.
pub struct ProgressReader<R> {
    inner: R,
    progress: Progress,
}

impl<R> ProgressReader<R> {
    /// Wraps `inner`.
    pub fn new(inner: R, progress: Progress) -> Self {
        Self { inner, progress }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for ProgressReader<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.progress.inc(n as u64);
        }
        r
    }
}

/// Counts the bytes written through it.
pub struct ProgressWriter<W> {
    inner: W,
    progress: Progress,
}

impl<W> ProgressWriter<W> {
    /// Wraps `inner`.
    pub fn new(inner: W, progress: Progress) -> Self {
        Self { inner, progress }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for ProgressWriter<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &r {
            self.progress.inc(*n as u64);
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<W: ChunkWrite> ChunkWrite for ProgressWriter<W> {
    async fn write_chunk(&mut self, chunk: bytes::Bytes) -> std::io::Result<()> {
        let n = chunk.len() as u64;
        self.inner.write_chunk(chunk).await?;
        self.progress.inc(n);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_lines_show_rate_and_eta() {
        let s = Sink::Plain {
            label: "flash".into(),
            total: Some(2048),
            done: 1024,
            started: Instant::now() - Duration::from_secs(1),
            last: Instant::now(),
        };
        let line = plain_line(&s);
        assert!(line.starts_with("flash: 1.0 KiB / 2.0 KiB (50%)"), "{line}");
        assert!(line.contains("ETA"), "{line}");
        assert_eq!(human(1536.0 * 1024.0), "1.5 MiB");
    }

    #[test]
    fn a_total_learnt_later_brings_a_percentage() {
        let p = Progress(Arc::new(Mutex::new(Sink::Plain {
            label: "dump".into(),
            total: None,
            done: 0,
            started: Instant::now(),
            last: Instant::now(),
        })));
        p.inc(1024);
        p.set_total(0);
        assert!(plain_line(&p.lock()).starts_with("dump: 1.0 KiB, "));
        p.set_total(4096);
        let line = plain_line(&p.lock());
        assert!(line.starts_with("dump: 1.0 KiB / 4.0 KiB (25%)"), "{line}");
        assert!(!p.is_hidden() && Progress::hidden().is_hidden());
        Progress::hidden().set_total(1);
    }

    #[tokio::test]
    async fn readers_and_writers_count() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let p = Progress::hidden();
        let mut r = ProgressReader::new(&b"hello"[..], p.clone());
        let mut v = Vec::new();
        r.read_to_end(&mut v).await.unwrap();
        let mut w = ProgressWriter::new(Vec::new(), p);
        w.write_all(b"abc").await.unwrap();
        assert_eq!(w.inner, b"abc");
    }
}
