//! Where the time of a command goes: a timeline of its steps (`jmp shell --timings`,
//! `JMP_TIMINGS=1`), each with its start offset and its duration since the process began.
//!
//! Steps are marked at their boundaries with monotonic timestamps ([`step`] returns a guard
//! that records the step when dropped, or at [`Step::end`]). Until [`start`] is called,
//! marking a step costs one relaxed atomic load and records nothing.
//!
//! ```
//! use jumpstarter_core::client::timings;
//! timings::start(std::time::Instant::now());
//! {
//!     let _s = timings::step("config load");
//!     // ... read the config ...
//! }
//! let text = timings::render().unwrap_or_default();
//! assert!(text.contains("config load"));
//! ```

use std::{
    fmt::Write as _,
    sync::{
        Mutex, OnceLock,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use crate::sync::LockExt;

/// The most steps one timeline keeps: a long-lived process marking steps in a loop stays
/// bounded (later steps are counted, not kept).
pub const MAX_STEPS: usize = 256;

static ON: AtomicBool = AtomicBool::new(false);
static TIMELINE: OnceLock<Timeline> = OnceLock::new();

struct Timeline {
    origin: Instant,
    steps: Mutex<Steps>,
}

#[derive(Default)]
struct Steps {
    kept: Vec<Record>,
    dropped: usize,
}

/// One recorded step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// What the step was.
    pub name: String,
    /// Its start, since the timeline's origin.
    pub start: Duration,
    /// How long it took.
    pub duration: Duration,
}

/// Turns the timeline on, with offsets counted from `origin` (the start of `main`). Later
/// calls keep the first origin.
pub fn start(origin: Instant) {
    let _ = TIMELINE.set(Timeline {
        origin,
        steps: Mutex::new(Steps::default()),
    });
    ON.store(true, Ordering::Relaxed);
}

/// Whether steps are recorded.
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Whether the environment asks for a timeline (`JMP_TIMINGS` set to anything but empty or
/// `0`).
pub fn wanted_by_env() -> bool {
    std::env::var_os("JMP_TIMINGS").is_some_and(|v| !v.is_empty() && v != "0")
}

/// A step in progress: recorded when dropped (or at [`Step::end`]).
#[must_use = "a step is recorded when this guard is dropped; bind it to a variable"]
pub struct Step {
    name: &'static str,
    detail: Option<String>,
    start: Option<Instant>,
}

impl Step {
    /// Adds a detail shown after the step's name (e.g. how many polls it took).
    pub fn detail(&mut self, detail: impl FnOnce() -> String) {
        if self.start.is_some() {
            self.detail = Some(detail());
        }
    }

    /// Ends the step now.
    pub fn end(self) {}
}

impl Drop for Step {
    fn drop(&mut self) {
        if let Some(start) = self.start {
            let name = match self.detail.take() {
                Some(d) => format!("{} ({d})", self.name),
                None => self.name.to_string(),
            };
            record(name, start, Instant::now());
        }
    }
}

/// Starts a step named `name`, recorded when the guard is dropped; does nothing while the
/// timeline is off.
pub fn step(name: &'static str) -> Step {
    Step {
        name,
        detail: None,
        start: enabled().then(Instant::now),
    }
}

/// Records a step that ran from `start` to `end`.
pub fn record(name: impl Into<String>, start: Instant, end: Instant) {
    if !enabled() {
        return;
    }
    let Some(t) = TIMELINE.get() else {
        return;
    };
    let mut steps = t.steps.lock_or_recover();
    if steps.kept.len() >= MAX_STEPS {
        steps.dropped += 1;
        return;
    }
    steps.kept.push(Record {
        name: name.into(),
        start: start.saturating_duration_since(t.origin),
        duration: end.saturating_duration_since(start),
    });
}

/// The steps recorded so far, by start (a step that encloses another comes first).
pub fn records() -> Vec<Record> {
    let Some(t) = TIMELINE.get() else {
        return Vec::new();
    };
    let mut kept = t.steps.lock_or_recover().kept.clone();
    kept.sort_by(|a, b| a.start.cmp(&b.start).then(b.duration.cmp(&a.duration)));
    kept
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The timeline as text, one step a line with its start and duration in milliseconds, a
/// step inside another indented under it, and the total since the origin; `None` while the
/// timeline is off.
pub fn render() -> Option<String> {
    if !enabled() {
        return None;
    }
    let t = TIMELINE.get()?;
    let total = t.origin.elapsed();
    let steps = records();
    let dropped = t.steps.lock_or_recover().dropped;
    let mut out = String::from("timings (ms since the process started):\n");
    let _ = writeln!(out, "{:>9} {:>9}  step", "start", "took");
    // The ends of the steps enclosing the current one: its depth is how many there are.
    let mut open: Vec<Duration> = Vec::new();
    for s in &steps {
        let end = s.start + s.duration;
        while open.last().is_some_and(|&e| e < end) {
            open.pop();
        }
        let _ = writeln!(
            out,
            "{:>9.2} {:>9.2}  {}{}",
            ms(s.start),
            ms(s.duration),
            "  ".repeat(open.len()),
            s.name
        );
        open.push(end);
    }
    if dropped > 0 {
        let _ = writeln!(out, "({dropped} more steps not kept)");
    }
    let _ = writeln!(out, "{:>9.2} {:>9}  total", ms(total), "");
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_steps_are_indented_in_start_order() {
        start(Instant::now());
        let t0 = TIMELINE
            .get()
            .map(|t| t.origin)
            .unwrap_or_else(Instant::now);
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        record("outer", at(1), at(10));
        record("second inner", at(5), at(9));
        record("inner", at(2), at(4));
        record("after", at(11), at(12));
        let text = render().unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let pos = |name: &str| {
            lines
                .iter()
                .position(|l| l.ends_with(name))
                .unwrap_or(usize::MAX)
        };
        assert!(pos("  outer") < pos("    inner"), "{text}");
        assert!(pos("    inner") < pos("    second inner"), "{text}");
        assert!(pos("    second inner") < pos("  after"), "{text}");
        assert!(lines.last().is_some_and(|l| l.ends_with("total")), "{text}");
        let mut s = step("with detail");
        s.detail(|| "3 polls".into());
        s.end();
        assert!(records().iter().any(|r| r.name == "with detail (3 polls)"));
    }
}
