//! The end of a lease under `jmp shell`: noticing it, saying when and why ("Lease NAME ended
//! at TIME", as upstream), and answering the shell's later commands with gRPC UNAVAILABLE
//! "the lease ended ..." instead of a dropped connection.

use std::{convert::Infallible, path::Path, time::Duration};

use jumpstarter_core::client::lease::{AcquiredLease, LeaseError};
use jumpstarter_proto::client_v1::Lease;
use tokio_util::sync::CancellationToken;

/// The exit code of `jmp shell` when its lease ended while the command still ran (whatever
/// the command's own code): 75, `EX_TEMPFAIL` of sysexits.h ("try again later").
pub const LEASE_ENDED_EXIT_CODE: i32 = 75;

/// How often a lease is checked at most while its end is not near (so that a lease deleted
/// by someone else is noticed too).
const CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// How soon a lease past its end time is checked again, while the controller has not yet
/// marked it ended.
const PAST_END_INTERVAL: Duration = Duration::from_millis(500);

/// When and why a lease ended.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseEnd {
    /// When (the controller's `effective_end_time`, else when we noticed).
    pub at: jiff::Timestamp,
    /// Why, in words (`its duration of 5s ran out`).
    pub reason: String,
}

impl LeaseEnd {
    /// `Lease NAME ended at TIME: REASON` (upstream logs `Lease NAME ended at TIME`).
    pub fn message(&self, lease: &str) -> String {
        format!(
            "Lease {lease} ended at {}: {}",
            local_time(self.at),
            self.reason
        )
    }

    /// What the shell's commands get after the end (with gRPC code UNAVAILABLE).
    pub fn status_message(&self, lease: &str) -> String {
        format!(
            "the lease ended (lease {lease} ended at {}: {})",
            local_time(self.at),
            self.reason
        )
    }
}

/// `2026-12-01 23:40:05 +00:00` in the local time zone.
fn local_time(t: jiff::Timestamp) -> String {
    t.to_zoned(jiff::tz::TimeZone::system())
        .strftime("%Y-%m-%d %H:%M:%S %:z")
        .to_string()
}

fn timestamp(t: &prost_types::Timestamp) -> Option<jiff::Timestamp> {
    jiff::Timestamp::new(t.seconds, t.nanos).ok()
}

fn duration_text(d: &prost_types::Duration) -> String {
    let secs = u64::try_from(d.seconds).unwrap_or(0);
    let mut text = String::new();
    for (n, unit) in [(secs / 3600, 'h'), (secs / 60 % 60, 'm'), (secs % 60, 's')] {
        if n > 0 {
            text.push_str(&format!("{n}{unit}"));
        }
    }
    if text.is_empty() { "0s".into() } else { text }
}

/// When `lease` is expected to end: `effective_end_time`, else its effective begin plus its
/// duration.
fn expected_end(lease: &Lease) -> Option<jiff::Timestamp> {
    if let Some(end) = lease.effective_end_time.as_ref().and_then(timestamp) {
        return Some(end);
    }
    let begin = lease.effective_begin_time.as_ref().and_then(timestamp)?;
    let d = lease.duration.as_ref()?;
    begin
        .checked_add(jiff::SignedDuration::new(d.seconds, d.nanos))
        .ok()
}

/// Whether `lease` has ended (its `Ready` condition is False for `Expired` or `Released`),
/// and when and why.
pub fn ended(lease: &Lease, now: jiff::Timestamp) -> Option<LeaseEnd> {
    let ready = lease
        .conditions
        .iter()
        .find(|c| c.r#type.as_deref() == Some("Ready"))?;
    if ready.status.as_deref() != Some("False") {
        return None;
    }
    let message = ready.message.clone().filter(|m| !m.is_empty());
    let reason = match ready.reason.as_deref() {
        Some("Expired") => match &lease.duration {
            Some(d) => format!("its duration of {} ran out", duration_text(d)),
            None => "it expired".to_string(),
        },
        Some("Released") => match message {
            Some(m) => format!("it was released ({m})"),
            None => "it was released".to_string(),
        },
        _ => return None,
    };
    let at = lease
        .effective_end_time
        .as_ref()
        .and_then(timestamp)
        .unwrap_or(now);
    Some(LeaseEnd { at, reason })
}

/// How long to wait before checking `lease` again.
fn next_check(lease: &Lease, now: jiff::Timestamp) -> Duration {
    match expected_end(lease) {
        Some(end) => {
            let left = end.duration_since(now);
            match Duration::try_from(left) {
                // A little after the end, so that the controller has marked it.
                Ok(left) => (left + Duration::from_millis(200)).min(CHECK_INTERVAL),
                Err(_) => PAST_END_INTERVAL,
            }
        }
        None => CHECK_INTERVAL,
    }
}

/// What the controller says of a lease now.
enum Check {
    /// It has ended, when and why.
    Ended(LeaseEnd),
    /// It goes on; check again after this long.
    Live(Duration),
    /// The controller could not be asked.
    Unknown,
}

/// Asks the controller about `lease`: ended (expired, released, or deleted by someone else:
/// NOT_FOUND), live, or unknown.
async fn check(lease: &AcquiredLease) -> Check {
    let now = jiff::Timestamp::now();
    match lease.status().await {
        Ok(l) => match ended(&l, now) {
            Some(end) => Check::Ended(end),
            None => Check::Live(next_check(&l, now)),
        },
        Err(LeaseError::Rpc {
            code: tonic::Code::NotFound,
            ..
        }) => Check::Ended(LeaseEnd {
            at: now,
            reason: "it no longer exists on the controller".into(),
        }),
        Err(e) => {
            tracing::debug!(
                "checking lease {}: {e}",
                lease.name,
                e = jumpstarter_core::error_chain(&e)
            );
            Check::Unknown
        }
    }
}

/// Resolves when the lease has ended (expired, released or deleted by someone else), with
/// when and why; checks with the controller around the lease's end time, every
/// `CHECK_INTERVAL` besides, and at once when `seen` asks (a tunnel was lost: perhaps
/// because the lease ended). A controller that cannot be reached for a while is no end.
pub async fn watch(lease: &AcquiredLease, seen: &EndSeen) -> LeaseEnd {
    loop {
        let wait = match check(lease).await {
            Check::Ended(end) => return end,
            Check::Live(wait) => wait,
            Check::Unknown => CHECK_INTERVAL.min(Duration::from_secs(2)),
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = seen.0.check_now.notified() => {}
        }
    }
}

/// How long the warning of a lost router tunnel is held back, in case the lease turns out to
/// have ended. The exporter learns of the end from the controller's stream and closes its
/// side of the tunnel at once, so the router often fails our side a little *before* the
/// shell's status check sees the end (it checks just after the expected end time, every
/// `PAST_END_INTERVAL` after that, and at once when a tunnel is lost): well within a second
/// on a working controller. A lost tunnel during a live lease is still reported, this much
/// later.
pub const LOST_GRACE: Duration = Duration::from_secs(1);

/// What `jmp shell`'s lease watch and its tunnel events share: whether the lease is known to
/// have ended, and a way for a lost tunnel to have the lease checked at once. A tunnel the
/// router closes because the lease ended is the lease's end, said once by the shell; it is
/// not reported as a lost connection.
#[derive(Clone)]
pub struct EndSeen(std::sync::Arc<Shared>);

struct Shared {
    /// True once the shell knows the lease ended.
    ended: tokio::sync::watch::Sender<bool>,
    /// Wakes [`watch`] for a check now (a permit is kept when it is not waiting).
    check_now: tokio::sync::Notify,
    /// How many lost-tunnel warnings are being held back.
    held: tokio::sync::watch::Sender<usize>,
}

impl Default for EndSeen {
    fn default() -> Self {
        Self(std::sync::Arc::new(Shared {
            ended: tokio::sync::watch::Sender::new(false),
            check_now: tokio::sync::Notify::new(),
            held: tokio::sync::watch::Sender::new(0),
        }))
    }
}

impl EndSeen {
    /// The shell knows the lease ended: warnings held back are dropped, later ones not said.
    pub fn mark_ended(&self) {
        self.0.ended.send_replace(true);
    }

    /// Says `warning` (a lost tunnel) on stderr unless the lease is known to have ended
    /// within [`LOST_GRACE`]; has the lease checked at once meanwhile.
    pub fn warn_unless_ended(&self, warning: String) {
        self.say_unless_ended(warning, |w| eprintln!("{w}"));
    }

    /// [`Self::warn_unless_ended`], saying it with `say`.
    fn say_unless_ended(&self, warning: String, say: impl FnOnce(String) + Send + 'static) {
        if *self.0.ended.borrow() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            say(warning);
            return;
        };
        self.0.check_now.notify_one();
        self.0.held.send_modify(|n| *n += 1);
        let this = self.clone();
        runtime.spawn(async move {
            let mut ended = this.0.ended.subscribe();
            let seen = tokio::time::timeout(LOST_GRACE, ended.wait_for(|e| *e)).await;
            if !matches!(seen, Ok(Ok(_))) {
                say(warning);
            }
            this.0.held.send_modify(|n| *n = n.saturating_sub(1));
        });
    }

    /// Waits (at most about [`LOST_GRACE`]) for the warnings held back to be said or dropped,
    /// so that none is lost when the shell exits.
    pub async fn flush(&self) {
        let mut held = self.0.held.subscribe();
        let _ = tokio::time::timeout(LOST_GRACE * 2, held.wait_for(|n| *n == 0)).await;
    }
}

/// A gRPC service named `NAME` that answers every call with UNAVAILABLE and one message.
#[derive(Clone)]
struct Unavailable<const EXPORTER: bool> {
    message: std::sync::Arc<str>,
}

impl<const EXPORTER: bool> tower::Service<http::Request<tonic::body::Body>>
    for Unavailable<EXPORTER>
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<tonic::body::Body>) -> Self::Future {
        std::future::ready(Ok(
            tonic::Status::unavailable(self.message.to_string()).into_http()
        ))
    }
}

impl tonic::server::NamedService for Unavailable<true> {
    const NAME: &'static str = "jumpstarter.v1.ExporterService";
}

impl tonic::server::NamedService for Unavailable<false> {
    const NAME: &'static str = "jumpstarter.v1.RouterService";
}

/// Serves `socket` (the shell's `JUMPSTARTER_HOST`, whose tunnel server has stopped) until
/// `cancel`, answering every exporter and router call with UNAVAILABLE `message`.
pub async fn serve_ended(socket: &Path, message: String, cancel: CancellationToken) {
    let _ = std::fs::remove_file(socket);
    let listener = match tokio::net::UnixListener::bind(socket) {
        Ok(l) => l,
        Err(e) => {
            tracing::debug!(
                "cannot listen on {}: {e}",
                socket.display(),
                e = jumpstarter_core::error_chain(&e)
            );
            return;
        }
    };
    let message: std::sync::Arc<str> = message.into();
    let served = tonic::transport::Server::builder()
        .add_service(Unavailable::<true> {
            message: message.clone(),
        })
        .add_service(Unavailable::<false> { message })
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::UnixListenerStream::new(listener),
            cancel.cancelled_owned(),
        )
        .await;
    if let Err(e) = served {
        tracing::debug!(
            "serving {} after the lease ended: {e}",
            socket.display(),
            e = jumpstarter_core::error_chain(&e)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jumpstarter_proto::v1::Condition;

    fn lease(status: &str, reason: &str, message: &str) -> Lease {
        Lease {
            duration: Some(prost_types::Duration {
                seconds: 5,
                nanos: 0,
            }),
            effective_begin_time: Some(prost_types::Timestamp {
                seconds: 1_000,
                nanos: 0,
            }),
            effective_end_time: (status == "False").then_some(prost_types::Timestamp {
                seconds: 1_005,
                nanos: 0,
            }),
            conditions: vec![Condition {
                r#type: Some("Ready".into()),
                status: Some(status.into()),
                reason: Some(reason.into()),
                message: Some(message.into()),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn at(secs: i64) -> jiff::Timestamp {
        jiff::Timestamp::new(secs, 0).unwrap()
    }

    #[test]
    fn an_expired_lease_ended_when_the_controller_says_and_because_its_time_ran_out() {
        let end = ended(
            &lease("False", "Expired", "The lease has expired"),
            at(1_006),
        )
        .unwrap();
        assert_eq!(end.at, at(1_005));
        assert_eq!(end.reason, "its duration of 5s ran out");
    }

    #[test]
    fn a_released_lease_says_so_with_the_controllers_message() {
        let end = ended(&lease("False", "Released", "deleted by admin"), at(1_006)).unwrap();
        assert_eq!(end.reason, "it was released (deleted by admin)");
    }

    #[test]
    fn a_ready_or_pending_lease_has_not_ended() {
        assert_eq!(ended(&lease("True", "Ready", ""), at(1_002)), None);
        assert_eq!(ended(&lease("False", "Pending", "queued"), at(1_002)), None);
        assert_eq!(ended(&Lease::default(), at(1_002)), None);
    }

    #[test]
    fn checks_come_just_after_the_expected_end_and_at_least_every_interval() {
        let l = lease("True", "Ready", "");
        assert_eq!(next_check(&l, at(1_002)), Duration::from_millis(3_200));
        assert_eq!(next_check(&l, at(1_010)), PAST_END_INTERVAL);
        let long = Lease {
            duration: Some(prost_types::Duration {
                seconds: 3_600,
                nanos: 0,
            }),
            ..l
        };
        assert_eq!(next_check(&long, at(1_002)), CHECK_INTERVAL);
        assert_eq!(next_check(&Lease::default(), at(1_002)), CHECK_INTERVAL);
    }

    /// What [`EndSeen`] said, in order.
    #[derive(Clone, Default)]
    struct Said(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

    impl Said {
        fn say(&self) -> impl FnOnce(String) + Send + 'static {
            let to = self.clone();
            move |w| to.0.lock().unwrap().push(w)
        }

        fn lines(&self) -> Vec<String> {
            self.0.lock().unwrap().clone()
        }
    }

    #[tokio::test]
    async fn a_lost_tunnel_while_the_lease_lives_is_said_and_has_the_lease_checked() {
        let seen = EndSeen::default();
        let said = Said::default();
        seen.say_unless_ended("lost".into(), said.say());
        // The watch is woken for a check at once (the permit waits for it).
        tokio::time::timeout(Duration::from_secs(5), seen.0.check_now.notified())
            .await
            .expect("no check asked for");
        seen.flush().await;
        assert_eq!(said.lines(), ["lost"]);
    }

    #[tokio::test]
    async fn a_lost_tunnel_the_lease_end_follows_or_precedes_is_not_said() {
        let seen = EndSeen::default();
        let said = Said::default();
        // The router fails the tunnel, then the shell learns that the lease ended.
        seen.say_unless_ended("lost before".into(), said.say());
        seen.mark_ended();
        seen.flush().await;
        // Once the end is known, later losses are the end too.
        seen.say_unless_ended("lost after".into(), said.say());
        seen.flush().await;
        assert_eq!(said.lines(), Vec::<String>::new());
    }

    #[test]
    fn durations_read_as_people_write_them() {
        let d = |seconds| duration_text(&prost_types::Duration { seconds, nanos: 0 });
        assert_eq!(d(5), "5s");
        assert_eq!(d(120), "2m");
        assert_eq!(d(90), "1m30s");
        assert_eq!(d(3_600), "1h");
        assert_eq!(d(5_400), "1h30m");
        assert_eq!(d(0), "0s");
    }
}
