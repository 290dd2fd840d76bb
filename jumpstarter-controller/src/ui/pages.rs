//! The dashboard's pages (server-side HTML with maud, escaped by default). Each page is the
//! layout around a `<main id="content">`; a request with the header `X-UI-Fragment: 1` gets
//! only that content, which the script fetches again when the event stream says the page's
//! objects changed.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use axum::{
    extract::{Path, Query, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use jiff::{SignedDuration, Timestamp};
use maud::{Markup, html};
use serde::Deserialize;

use super::{
    app::{Ui, UiState},
    layout::{Nav, error_page, page},
    login,
    session::Login,
    view::View,
};
use crate::{
    objects::{
        Exporter, Lease, conditions as c, find_condition, selector::LabelSelector,
        virtualtarget::ExporterSet,
    },
    store::Store,
};

/// Exporters on a fleet page unless `per_page` says otherwise.
pub const DEFAULT_PER_PAGE: usize = 100;
/// The most exporters on one fleet page.
pub const MAX_PER_PAGE: usize = 500;
/// Characters of the fleet's `q` and `selector`.
const MAX_QUERY: usize = crate::service::limits::MAX_SELECTOR;
/// Ended leases on the leases page.
const ENDED_SHOWN: usize = 100;
/// Recent leases on an exporter's page.
const RECENT_LEASES: usize = 20;
/// Log lines on an exporter's page.
const LOG_LINES: usize = 500;
/// How long a page waits for the view's first listing (a controller just started).
const SYNC_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// Output lines shown per hook run, at most.
const HOOK_OUTPUT_LINES: usize = 200;
/// Bytes of output shown per hook run, at most.
const HOOK_OUTPUT_BYTES: usize = 16 * 1024;

// ---------------------------------------------------------------------------------------------
// Shared bits

/// `t` as `2026-01-02 03:04:05Z`.
fn when(t: Timestamp) -> String {
    t.strftime("%Y-%m-%d %H:%M:%SZ").to_string()
}

/// A duration in words: `3d 4h`, `5h 6m`, `7m 8s`, `9s`.
fn span(d: SignedDuration) -> String {
    let s = d.as_secs().unsigned_abs();
    let (days, hours, mins, secs) = (s / 86400, s / 3600 % 24, s / 60 % 60, s % 60);
    if days > 0 {
        format!("{days}d {hours}h")
    } else if hours > 0 {
        format!("{hours}h {mins}m")
    } else if mins > 0 {
        format!("{mins}m {secs}s")
    } else {
        format!("{secs}s")
    }
}

/// A health check's duration as shown: milliseconds under a second, else seconds.
fn duration_text(d: std::time::Duration) -> String {
    if d < std::time::Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// `t` with how long ago (or in how long) it is.
fn time_cell(t: Option<Timestamp>, now: Timestamp) -> Markup {
    match t {
        None => html! { span class="muted" { "never" } },
        Some(t) => {
            let d = now.duration_since(t);
            let rel = if d.is_negative() {
                format!("in {}", span(d))
            } else {
                format!("{} ago", span(d))
            };
            html! { time datetime=(t.to_string()) title=(when(t)) { (rel) } }
        }
    }
}

/// `namespace/name` of an object.
fn key_text(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

fn ns_name(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> (&str, &str) {
    (
        m.namespace.as_deref().unwrap_or_default(),
        m.name.as_deref().unwrap_or_default(),
    )
}

/// Percent-encodes a query value or path segment (RFC 3986 unreserved characters stay).
fn enc(s: &str) -> String {
    jumpstarter_core::oidc::url_encode(s)
}

/// An exporter's labels as clients are shown them: without the controller's `hiddenLabels`
/// (and the deprecated ones, as the client API leaves them out) and the `hidden.` prefix.
fn visible_labels<'a, S: Store>(
    ui: &Ui<S>,
    labels: &'a BTreeMap<String, String>,
) -> impl Iterator<Item = (&'a String, &'a String)> {
    let policy = &ui.state.label_policy;
    labels.iter().filter(move |(k, _)| {
        !policy.hidden.contains(*k)
            && !policy.deprecated.contains_key(*k)
            && !jumpstarter_core::labels::is_hidden_label(k)
    })
}

fn labels_cell<'a>(labels: impl Iterator<Item = (&'a String, &'a String)>) -> Markup {
    html! {
        @for (k, v) in labels {
            span class="label" { (k) "=" (v) } " "
        }
    }
}

/// When a lease is expected to end: its `endTime`, else its begin plus its duration.
fn expected_end(l: &Lease) -> Option<Timestamp> {
    if let Some(e) = &l.spec.end_time {
        return Some(e.0);
    }
    let begin = l
        .status
        .as_ref()
        .and_then(|s| s.begin_time.as_ref())
        .or(l.spec.begin_time.as_ref())?;
    let d = l.spec.duration?;
    begin.0.checked_add(d.0).ok()
}

fn selector_text(l: &Lease) -> String {
    LabelSelector::from_k8s(&l.spec.selector)
        .map(|s| s.to_selector_string())
        .unwrap_or_else(|e| format!("(unreadable: {e})"))
}

fn context_cell(l: &Lease) -> Markup {
    html! {
        @for (k, v) in &l.spec.context {
            span class="label" { (k) "=" (v) } " "
        }
    }
}

fn created(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<Timestamp> {
    m.creation_timestamp.as_ref().map(|t| t.0)
}

/// The place in the queue a waiting lease's `Pending` message names (`position N in queue`).
fn queue_position(l: &Lease) -> Option<u64> {
    let st = l.status.as_ref()?;
    let p = find_condition(&st.conditions, c::PENDING)?;
    let rest = p.message.rsplit_once("(position ")?.1;
    rest.split(' ').next()?.parse().ok()
}

/// How an ended lease ended: the reason and message of its terminal or `Ready` condition.
fn how_ended(l: &Lease) -> String {
    let Some(st) = l.status.as_ref() else {
        return String::new();
    };
    for t in [c::UNSATISFIABLE, c::INVALID, c::READY] {
        if let Some(cond) = find_condition(&st.conditions, t)
            && (t != c::READY || cond.status == c::FALSE)
        {
            return format!("{}: {}", cond.reason, cond.message);
        }
    }
    "ended".into()
}

/// The state one fleet row shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    /// Online, enabled, healthy, not leased.
    Online,
    /// Serving a lease.
    Leased,
    /// Not online.
    Offline,
    /// `spec.enabled` false.
    Disabled,
    /// `Healthy=False`.
    Quarantined,
}

impl Status {
    /// The word of `data-status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Online => "online",
            Status::Leased => "leased",
            Status::Offline => "offline",
            Status::Disabled => "disabled",
            Status::Quarantined => "quarantined",
        }
    }
}

/// An exporter's state: disabled, else quarantined, else leased, else online or offline.
pub fn status_of(e: &Exporter, holder: Option<&Lease>) -> Status {
    if !e.is_enabled() {
        Status::Disabled
    } else if e.unhealthy().is_some() {
        Status::Quarantined
    } else if holder.is_some() || e.status.as_ref().is_some_and(|s| s.lease_ref.is_some()) {
        Status::Leased
    } else if e.condition_is_true(c::ONLINE) {
        Status::Online
    } else {
        Status::Offline
    }
}

/// The lease holding each exporter (namespace, exporter name), among the leases not ended.
fn holders(leases: &[Arc<Lease>]) -> HashMap<(String, String), Arc<Lease>> {
    leases
        .iter()
        .filter(|l| !l.is_ended())
        .filter_map(|l| {
            let ns = l.metadata.namespace.clone().unwrap_or_default();
            Some(((ns, l.assigned_exporter()?.to_string()), l.clone()))
        })
        .collect()
}

fn last_seen(e: &Exporter) -> Option<Timestamp> {
    e.status
        .as_ref()
        .and_then(|s| s.last_seen.as_ref())
        .map(|t| t.0)
}

fn action_button(url: &str, action: &str, target_attr: &str, target: &str, text: &str) -> Markup {
    let confirm = format!("{text} {target}?");
    html! {
        @if target_attr == "lease" {
            button type="button" data-action=(action) data-lease=(target) data-url=(url)
                data-confirm=(confirm) { (text) }
        } @else {
            button type="button" data-action=(action) data-exporter=(target) data-url=(url)
                data-confirm=(confirm) { (text) }
        }
    }
}

fn exporter_buttons(ns: &str, name: &str, e: &Exporter) -> Markup {
    let base = format!("/ui/exporters/{}/{}", enc(ns), enc(name));
    let target = key_text(ns, name);
    let (q, q_text) = if e.unhealthy().is_some() {
        ("unquarantine", "Unquarantine")
    } else {
        ("quarantine", "Quarantine")
    };
    let (d, d_text) = if e.is_enabled() {
        ("disable", "Disable")
    } else {
        ("enable", "Enable")
    };
    html! {
        (action_button(&format!("{base}/{q}"), q, "exporter", &target, q_text))
        " "
        (action_button(&format!("{base}/{d}"), d, "exporter", &target, d_text))
    }
}

fn end_button(l: &Lease) -> Markup {
    let (ns, name) = ns_name(&l.metadata);
    html! {
        (action_button(
            &format!("/ui/leases/{}/{}/end", enc(ns), enc(name)),
            "end-lease",
            "lease",
            &key_text(ns, name),
            "End lease",
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// Fleet

/// The fleet page's query.
#[derive(Debug, Default, Deserialize)]
pub struct FleetQuery {
    page: Option<String>,
    per_page: Option<String>,
    selector: Option<String>,
    q: Option<String>,
    sort: Option<String>,
}

/// How the fleet is sorted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sort {
    Name,
    Status,
    Seen,
    Holder,
}

const SORTS: [(&str, Sort); 4] = [
    ("name", Sort::Name),
    ("status", Sort::Status),
    ("last-seen", Sort::Seen),
    ("holder", Sort::Holder),
];

/// A checked fleet query.
#[derive(Debug, Clone)]
struct Fleet {
    page: usize,
    per_page: usize,
    selector: String,
    q: String,
    sort: Sort,
}

fn number(what: &str, v: Option<&str>, default: usize) -> Result<usize, String> {
    match v.map(str::trim) {
        None | Some("") => Ok(default),
        Some(v) => v.parse::<usize>().map_err(|_| {
            format!(
                "{what} {v:?} is not a number: give a whole number from 1 (e.g. ?{what}=2)",
                v = v.chars().take(40).collect::<String>()
            )
        }),
    }
}

impl FleetQuery {
    fn check(&self) -> Result<(Fleet, LabelSelector), String> {
        let page = number("page", self.page.as_deref(), 1)?.max(1);
        let per_page =
            number("per_page", self.per_page.as_deref(), DEFAULT_PER_PAGE)?.clamp(1, MAX_PER_PAGE);
        let selector = self.selector.clone().unwrap_or_default();
        let q = self.q.clone().unwrap_or_default();
        if selector.len() > MAX_QUERY || q.len() > MAX_QUERY {
            return Err(format!(
                "the selector and the search have at most {MAX_QUERY} characters"
            ));
        }
        let parsed = LabelSelector::parse(selector.trim()).map_err(|e| {
            format!(
                "selector {selector:?}: {e} (the syntax of `jmp get exporters -l`, e.g. \
                 board=rpi4,site!=lab2)",
                e = jumpstarter_core::error_chain(&e)
            )
        })?;
        let sort = match self.sort.as_deref().map(str::trim) {
            None | Some("") => Sort::Name,
            Some(s) => SORTS
                .iter()
                .find(|(n, _)| *n == s)
                .map(|(_, v)| *v)
                .ok_or_else(|| {
                    format!(
                        "sort {s:?} is not one of {}",
                        SORTS.map(|(n, _)| n).join(", ")
                    )
                })?,
        };
        Ok((
            Fleet {
                page,
                per_page,
                selector,
                q,
                sort,
            },
            parsed,
        ))
    }
}

impl Fleet {
    fn url(&self, page: usize, sort: Sort) -> String {
        let sort_name = SORTS
            .iter()
            .find(|(_, s)| *s == sort)
            .map_or("name", |(n, _)| n);
        format!(
            "/ui?page={page}&per_page={}&selector={}&q={}&sort={sort_name}",
            self.per_page,
            enc(&self.selector),
            enc(&self.q),
        )
    }
}

/// One fleet row.
struct Row<'a> {
    ns: &'a str,
    name: &'a str,
    exporter: &'a Exporter,
    status: Status,
    holder: Option<&'a Lease>,
}

/// `GET /ui`: the fleet.
pub async fn fleet<S: Store>(
    State(ui): UiState<S>,
    headers: HeaderMap,
    query: Result<Query<FleetQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let login = match login::page_login(&ui, &headers).await {
        Ok(l) => l,
        Err(r) => return r,
    };
    ui.view.synced(SYNC_WAIT).await;
    let checked = query
        .map_err(|e| format!("the query could not be read: {}", e.body_text()))
        .and_then(|Query(q)| q.check());
    let (fleet, selector) = match checked {
        Ok(f) => f,
        Err(e) => return error_page(&headers, &login, StatusCode::BAD_REQUEST, Nav::Fleet, &e),
    };
    let content = fleet_content(&ui, &login, &fleet, &selector, Timestamp::now());
    page(
        &headers,
        &login,
        "Fleet",
        Nav::Fleet,
        "exporters leases",
        content,
    )
    .into_response()
}

fn fleet_content<S: Store>(
    ui: &Ui<S>,
    login: &Login,
    fleet: &Fleet,
    selector: &LabelSelector,
    now: Timestamp,
) -> Markup {
    let exporters = View::all(&ui.view.exporters);
    let leases = View::all(&ui.view.leases);
    let holders = holders(&leases);
    let needle = fleet.q.trim().to_lowercase();
    let mut rows: Vec<Row<'_>> = exporters
        .iter()
        .filter(|e| selector.matches(e.label_map()))
        .map(|e| {
            let (ns, name) = ns_name(&e.metadata);
            let holder = holders
                .get(&(ns.to_string(), name.to_string()))
                .map(|l| l.as_ref());
            Row {
                ns,
                name,
                exporter: e,
                status: status_of(e, holder),
                holder,
            }
        })
        .filter(|r| {
            needle.is_empty()
                || r.name.to_lowercase().contains(&needle)
                || r.ns.to_lowercase().contains(&needle)
                || r.holder
                    .is_some_and(|l| l.spec.client_ref.name.to_lowercase().contains(&needle))
                || visible_labels(ui, r.exporter.label_map())
                    .any(|(k, v)| format!("{k}={v}").to_lowercase().contains(&needle))
        })
        .collect();
    let mut counts: BTreeMap<Status, usize> = BTreeMap::new();
    for r in &rows {
        *counts.entry(r.status).or_default() += 1;
    }
    match fleet.sort {
        Sort::Name => {} // the view is ordered by namespace and name
        Sort::Status => rows.sort_by_key(|r| r.status),
        Sort::Seen => rows.sort_by_key(|r| std::cmp::Reverse(last_seen(r.exporter))),
        Sort::Holder => rows.sort_by(|a, b| {
            let h = |r: &Row<'_>| r.holder.map(|l| l.spec.client_ref.name.clone());
            // Held first, by client name.
            (h(a).is_none(), h(a)).cmp(&(h(b).is_none(), h(b)))
        }),
    }
    let total = rows.len();
    let pages = total.div_ceil(fleet.per_page).max(1);
    let page_no = fleet.page.min(pages);
    let start = (page_no - 1) * fleet.per_page;
    let shown = rows
        .iter()
        .skip(start)
        .take(fleet.per_page)
        .collect::<Vec<_>>();
    let admin = login.is_admin();
    let sort_link = |s: Sort, text: &str| {
        html! { a href=(fleet.url(1, s)) class=[(fleet.sort == s).then_some("current")] { (text) } }
    };
    html! {
        h1 { "Fleet" }
        form method="get" action="/ui" class="filters" id="fleet-filters" {
            input type="text" name="selector" id="selector" value=(fleet.selector)
                placeholder="selector, e.g. board=rpi4,site!=lab2";
            input type="search" name="q" id="q" value=(fleet.q) placeholder="search";
            input type="hidden" name="per_page" value=(fleet.per_page);
            input type="hidden" name="sort" value=(SORTS.iter().find(|(_, s)| *s == fleet.sort).map_or("name", |(n, _)| n));
            button type="submit" { "Filter" }
        }
        p class="summary" id="fleet-summary" data-total=(total) {
            (total) " exporters"
            @for (s, n) in &counts { " · " span class={"status " (s.as_str())} { (n) " " (s.as_str()) } }
        }
        div class="scroll" {
            table id="fleet" data-page=(page_no) data-pages=(pages) {
                thead { tr {
                    th { (sort_link(Sort::Name, "Exporter")) }
                    th { (sort_link(Sort::Status, "Status")) }
                    th { "Labels" }
                    th { (sort_link(Sort::Holder, "Leased by")) }
                    th { "Until" }
                    th { "Health" }
                    th { (sort_link(Sort::Seen, "Last seen")) }
                    @if admin { th { "Actions" } }
                } }
                tbody {
                    @for r in &shown {
                        tr data-exporter=(key_text(r.ns, r.name)) data-status=(r.status.as_str()) {
                            td class="name" {
                                a href={"/ui/exporters/" (enc(r.ns)) "/" (enc(r.name))} { (r.name) }
                                " " span class="ns" { (r.ns) }
                            }
                            td class="status" { span class={"status " (r.status.as_str())} { (r.status.as_str()) } }
                            td class="labels" { (labels_cell(visible_labels(ui, r.exporter.label_map()))) }
                            td class="holder" {
                                @if let Some(l) = r.holder {
                                    (l.spec.client_ref.name)
                                    " " span class="muted" { "(" (ns_name(&l.metadata).1) ")" }
                                }
                            }
                            td class="until" {
                                @if let Some(l) = r.holder { (time_cell(expected_end(l), now)) }
                            }
                            td class="health" {
                                @match r.exporter.unhealthy() {
                                    Some(cond) => span class="bad" title=(cond.message) { "quarantined: " (cond.reason) },
                                    None => "healthy",
                                }
                            }
                            td class="seen" { (time_cell(last_seen(r.exporter), now)) }
                            @if admin { td class="actions" { (exporter_buttons(r.ns, r.name, r.exporter)) } }
                        }
                    }
                }
            }
        }
        @if total == 0 {
            p class="muted" id="fleet-empty" { "No exporter matches." }
        }
        nav class="pager" id="pager" {
            @if page_no > 1 {
                a href=(fleet.url(1, fleet.sort)) { "« first" } " "
                a href=(fleet.url(page_no - 1, fleet.sort)) rel="prev" { "‹ previous" } " "
            }
            span { "page " (page_no) " of " (pages) }
            @if page_no < pages {
                " " a href=(fleet.url(page_no + 1, fleet.sort)) rel="next" { "next ›" }
                " " a href=(fleet.url(pages, fleet.sort)) { "last »" }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Leases

/// `GET /ui/leases`: active leases, the queue, recent ended leases.
pub async fn leases<S: Store>(State(ui): UiState<S>, headers: HeaderMap) -> Response {
    let login = match login::page_login(&ui, &headers).await {
        Ok(l) => l,
        Err(r) => return r,
    };
    ui.view.synced(SYNC_WAIT).await;
    let content = leases_content(&ui, &login, Timestamp::now());
    page(&headers, &login, "Leases", Nav::Leases, "leases", content).into_response()
}

fn leases_content<S: Store>(ui: &Ui<S>, login: &Login, now: Timestamp) -> Markup {
    let leases = View::all(&ui.view.leases);
    let admin = login.is_admin();
    let active: Vec<&Arc<Lease>> = leases
        .iter()
        .filter(|l| !l.is_ended() && l.assigned_exporter().is_some())
        .collect();
    // The scheduler serves waiting leases by policy priority (descending), then creation,
    // then name, and writes each waiting lease's priority (`status.priority`) as it queues
    // it: the same order here, with each lease's place as the scheduler last wrote it.
    let mut queue: Vec<&Arc<Lease>> = leases
        .iter()
        .filter(|l| !l.is_ended() && l.assigned_exporter().is_none())
        .collect();
    queue.sort_by_key(|l| {
        (
            std::cmp::Reverse(l.status.as_ref().map_or(0, |s| s.priority)),
            created(&l.metadata).unwrap_or(Timestamp::MAX),
            ns_name(&l.metadata).1.to_string(),
        )
    });
    let mut ended: Vec<&Arc<Lease>> = leases.iter().filter(|l| l.is_ended()).collect();
    let end_time = |l: &Lease| {
        l.status
            .as_ref()
            .and_then(|s| s.end_time.as_ref())
            .map(|t| t.0)
    };
    ended.sort_by_key(|l| std::cmp::Reverse(end_time(l)));
    let ended_total = ended.len();
    ended.truncate(ENDED_SHOWN);
    html! {
        h1 { "Leases" }
        h2 { "Active (" (active.len()) ")" }
        div class="scroll" {
            table id="leases" {
                thead { tr {
                    th { "Lease" } th { "Client" } th { "Exporter" } th { "Selector" }
                    th { "Context" } th { "Since" } th { "Remaining" }
                    @if admin { th { "Actions" } }
                } }
                tbody {
                    @for l in &active {
                        @let (ns, name) = ns_name(&l.metadata);
                        @let exporter = l.assigned_exporter().unwrap_or_default();
                        tr data-lease=(key_text(ns, name)) {
                            td { (name) " " span class="ns" { (ns) } }
                            td class="client" { (l.spec.client_ref.name) }
                            td { a href={"/ui/exporters/" (enc(ns)) "/" (enc(exporter))} { (exporter) } }
                            td class="selector" { code { (selector_text(l)) } }
                            td { (context_cell(l)) }
                            td { (time_cell(l.status.as_ref().and_then(|s| s.begin_time.as_ref()).map(|t| t.0), now)) }
                            td class="remaining" {
                                @match expected_end(l) {
                                    Some(end) => (span(end.duration_since(now).max(SignedDuration::ZERO))),
                                    None => span class="muted" { "open" },
                                }
                            }
                            @if admin { td class="actions" { (end_button(l)) } }
                        }
                    }
                }
            }
        }
        h2 { "Waiting (" (queue.len()) ")" }
        p class="note" {
            "In the order the scheduler serves them: policy priority (the highest priority of "
            "the access-policy rules that let the lease's client use a matching exporter, "
            "non-spot rules first; 0 without policies), then age. The position is among the "
            "leases waiting for the same exporters, as the scheduler last wrote it."
        }
        div class="scroll" {
            table id="queue" {
                thead { tr {
                    th { "#" } th { "Lease" } th { "Client" } th { "Selector" } th { "Priority" }
                    th { "Waiting since" } th { "Why" }
                    @if admin { th { "Actions" } }
                } }
                tbody {
                    @for (i, l) in queue.iter().enumerate() {
                        @let (ns, name) = ns_name(&l.metadata);
                        tr data-lease=(key_text(ns, name)) data-order=(i + 1) {
                            td class="position" {
                                @match queue_position(l) { Some(p) => (p), None => span class="muted" { "-" } }
                            }
                            td { (name) " " span class="ns" { (ns) } }
                            td class="client" { (l.spec.client_ref.name) }
                            td class="selector" { code { (selector_text(l)) } }
                            td class="priority" { (l.status.as_ref().map_or(0, |s| s.priority)) }
                            td { (time_cell(created(&l.metadata), now)) }
                            td class="why" {
                                (l.status.as_ref().and_then(|s| find_condition(&s.conditions, c::PENDING)).map(|p| p.message.clone()).unwrap_or_default())
                            }
                            @if admin { td class="actions" { (end_button(l)) } }
                        }
                    }
                }
            }
        }
        h2 { "Recently ended (" (ended.len()) " of " (ended_total) ")" }
        div class="scroll" {
            table id="ended" {
                thead { tr { th { "Lease" } th { "Client" } th { "Exporter" } th { "Ended" } th { "How" } } }
                tbody {
                    @for l in &ended {
                        @let (ns, name) = ns_name(&l.metadata);
                        tr data-lease=(key_text(ns, name)) {
                            td { (name) " " span class="ns" { (ns) } }
                            td class="client" { (l.spec.client_ref.name) }
                            td { (l.assigned_exporter().unwrap_or("-")) }
                            td { (time_cell(end_time(l), now)) }
                            td class="how" { (how_ended(l)) }
                        }
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// One exporter

/// The exporter page's query: whose lease's log lines to show.
#[derive(Debug, Default, Deserialize)]
pub struct ExporterQuery {
    lease: Option<String>,
}

/// `GET /ui/exporters/{namespace}/{name}`.
pub async fn exporter<S: Store>(
    State(ui): UiState<S>,
    headers: HeaderMap,
    Path((namespace, name)): Path<(String, String)>,
    query: Result<Query<ExporterQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let login = match login::page_login(&ui, &headers).await {
        Ok(l) => l,
        Err(r) => return r,
    };
    ui.view.synced(SYNC_WAIT).await;
    let Some(e) = View::one(&ui.view.exporters, &namespace, &name) else {
        let shown = |s: &str| s.chars().take(253).collect::<String>();
        return error_page(
            &headers,
            &login,
            StatusCode::NOT_FOUND,
            Nav::Exporter,
            &format!("exporter {}/{} not found", shown(&namespace), shown(&name)),
        );
    };
    let chosen = query.ok().and_then(|Query(q)| q.lease);
    let content = exporter_content(&ui, &login, &e, chosen.as_deref(), Timestamp::now());
    page(
        &headers,
        &login,
        &name,
        Nav::Exporter,
        "exporters leases",
        content,
    )
    .into_response()
}

/// The driver tree of `devices`: each device under its parent (roots: no or unknown parent).
fn driver_tree(devices: &[crate::objects::Device]) -> Markup {
    let known: std::collections::HashSet<&str> = devices.iter().map(|d| d.uuid.as_str()).collect();
    let mut children: BTreeMap<Option<&str>, Vec<&crate::objects::Device>> = BTreeMap::new();
    for d in devices {
        let parent = d
            .parent_uuid
            .as_deref()
            .filter(|p| known.contains(p) && *p != d.uuid);
        children.entry(parent).or_default().push(d);
    }
    fn node(
        d: &crate::objects::Device,
        children: &BTreeMap<Option<&str>, Vec<&crate::objects::Device>>,
        depth: usize,
    ) -> Markup {
        let name = d
            .labels
            .get("jumpstarter.dev/name")
            .cloned()
            .unwrap_or_else(|| d.uuid.clone());
        let class = d.labels.get("jumpstarter.dev/client").cloned();
        html! {
            li {
                strong { (name) }
                @if let Some(c) = class { " " code { (c) } }
                @for (k, v) in d.labels.iter().filter(|(k, _)| !matches!(k.as_str(), "jumpstarter.dev/name" | "jumpstarter.dev/client")) {
                    " " span class="label" { (k) "=" (v) }
                }
                @if depth < 32 {
                    @if let Some(kids) = children.get(&Some(d.uuid.as_str())) {
                        ul { @for k in kids { (node(k, children, depth + 1)) } }
                    }
                }
            }
        }
    }
    html! {
        ul class="tree" id="drivers" {
            @for d in children.get(&None).map(Vec::as_slice).unwrap_or_default() {
                (node(d, &children, 0))
            }
        }
    }
}

fn exporter_content<S: Store>(
    ui: &Ui<S>,
    login: &Login,
    e: &Exporter,
    chosen_lease: Option<&str>,
    now: Timestamp,
) -> Markup {
    let (ns, name) = ns_name(&e.metadata);
    let leases = View::all(&ui.view.leases);
    let mut recent: Vec<&Arc<Lease>> = leases
        .iter()
        .filter(|l| {
            ns_name(&l.metadata).0 == ns
                && (l.assigned_exporter() == Some(name)
                    || l.spec.exporter_ref.as_ref().is_some_and(|r| r.name == name))
        })
        .collect();
    recent.sort_by_key(|l| std::cmp::Reverse(created(&l.metadata)));
    recent.truncate(RECENT_LEASES);
    let holder = recent
        .iter()
        .find(|l| !l.is_ended() && l.assigned_exporter() == Some(name))
        .map(|l| l.as_ref());
    let status = status_of(e, holder);
    let conditions = e
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    // The log lines: of the chosen lease, else of the newest lease that has some.
    let logs = ui.state.lease_logs.as_ref();
    let story_of = |lease: &str| logs.map(|l| l.read(ns, lease));
    let (log_lease, story) = match chosen_lease {
        Some(l) if recent.iter().any(|r| ns_name(&r.metadata).1 == l) => {
            (Some(l.to_string()), story_of(l))
        }
        _ => recent
            .iter()
            .map(|l| ns_name(&l.metadata).1)
            .find_map(|l| {
                story_of(l)
                    .filter(|s| !s.entries.is_empty())
                    .map(|s| (Some(l.to_string()), Some(s)))
            })
            .unwrap_or((None, None)),
    };
    let history = &ui.state.hook_history;
    let hook_runs = history.runs(ns, name);
    let health_events = history.health_events(ns, name);
    // Each run's output: its lease's pushed hook lines (read once per lease).
    let mut lease_entries: HashMap<&str, Vec<jumpstarter_proto::v1::LogEntry>> = HashMap::new();
    if let Some(logs) = logs {
        for run in &hook_runs {
            if let Some(l) = run.lease.as_deref() {
                lease_entries.entry(l).or_insert_with(|| {
                    logs.read(ns, l)
                        .entries
                        .into_iter()
                        .filter(crate::hook_history::is_any_hook_output)
                        .collect()
                });
            }
        }
    }
    let output_of = |run: &crate::hook_history::HookRun| -> (Vec<String>, bool) {
        let Some(entries) = run.lease.as_deref().and_then(|l| lease_entries.get(l)) else {
            return (Vec::new(), false);
        };
        let mut lines = Vec::new();
        let mut bytes = 0;
        for e in entries
            .iter()
            .filter(|e| crate::hook_history::is_hook_output(e, run.kind))
        {
            if lines.len() == HOOK_OUTPUT_LINES || bytes + e.message.len() > HOOK_OUTPUT_BYTES {
                return (lines, true);
            }
            bytes += e.message.len();
            lines.push(e.message.clone());
        }
        (lines, false)
    };
    let entry_time = |e: &jumpstarter_proto::v1::LogEntry| {
        e.timestamp
            .as_ref()
            .and_then(|t| Timestamp::new(t.seconds, t.nanos).ok())
            .map(when)
            .unwrap_or_default()
    };
    html! {
        h1 { (name) " " span class="ns" { (ns) } }
        p id="exporter-status" data-exporter=(key_text(ns, name)) data-status=(status.as_str()) {
            span class={"status " (status.as_str())} { (status.as_str()) }
            @if let Some(l) = holder {
                " · leased by " span class="holder" { (l.spec.client_ref.name) }
                " (" (ns_name(&l.metadata).1) ") until " (time_cell(expected_end(l), now))
            }
            " · last seen " (time_cell(last_seen(e), now))
            @if !e.is_enabled() { " · disabled" }
        }
        @if login.is_admin() {
            p class="actions" { (exporter_buttons(ns, name, e)) }
        }
        h2 { "Labels" }
        p { (labels_cell(visible_labels(ui, e.label_map()))) }
        h2 { "Health" }
        @match e.unhealthy() {
            Some(cond) => p class="bad" id="health" {
                "Quarantined since " (time_cell(Some(cond.last_transition_time.0), now)) ": "
                (cond.reason) " - " (cond.message)
            },
            None => p id="health" { "Healthy (not quarantined)." },
        }
        h2 { "Health history" }
        p class="note" {
            "What the controller saw of this exporter's health, newest first: each run of its "
            "health check, passed or failed, with its failures in a row out of the threshold "
            "that quarantines it, its duration and the last lines of its output (pushed by our "
            "exporter with log gathering; the last " (crate::hook_history::HEALTH_KEPT) "), and "
            "each time it reported itself unhealthy (its health check, or its hooks, failed "
            "that many times in a row), was quarantined or cleared by an admin (the last "
            (crate::hook_history::HEALTH_KEPT) "). Kept in the controller's memory: a restart "
            "(or a new leader) forgets it."
        }
        @if health_events.is_empty() {
            p class="muted" id="health-history" { "Nothing since this controller started." }
        } @else {
            div class="scroll" {
                table id="health-history" {
                    thead { tr { th { "When" } th { "Event" } th { "What / who" } th { "Failures in a row" } th { "Duration" } th { "Message" } } }
                    tbody {
                        @for ev in &health_events {
                            tr data-health=(ev.kind.as_str()) class=[(ev.kind == crate::hook_history::HealthKind::CheckFailed).then_some("sev-warning")] {
                                td { (time_cell(Some(ev.time), now)) }
                                td { (ev.kind.as_str()) }
                                td { (ev.source) }
                                @match &ev.check {
                                    Some(c) => {
                                        td class="failures" {
                                            (c.failures)
                                            @if c.threshold > 0 { " / " (c.threshold) }
                                        }
                                        td { @match c.duration { Some(d) => (duration_text(d)), None => "-" } }
                                        td {
                                            @if !ev.message.is_empty() { p class="message" { (ev.message) } }
                                            @if !c.output.is_empty() { pre class="output" { (c.output) } }
                                        }
                                    }
                                    None => {
                                        td { "-" } td { "-" }
                                        td { pre { (ev.message) } }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        h2 { "Conditions" }
        div class="scroll" {
            table id="conditions" {
                thead { tr { th { "Type" } th { "Status" } th { "Reason" } th { "Message" } th { "Since" } } }
                tbody {
                    @for cond in &conditions {
                        tr { td { (cond.type_) } td { (cond.status) } td { (cond.reason) }
                             td { (cond.message) } td { (time_cell(Some(cond.last_transition_time.0), now)) } }
                    }
                }
            }
        }
        h2 { "Drivers" }
        @match e.status.as_ref().and_then(|s| s.devices.as_ref()) {
            Some(devices) if !devices.is_empty() => (driver_tree(devices)),
            _ => p class="muted" id="drivers" { "No driver tree: the exporter has not registered (it reports its drivers when it connects)." },
        }
        h2 { "Recent leases" }
        div class="scroll" {
            table id="exporter-leases" {
                thead { tr { th { "Lease" } th { "Client" } th { "Created" } th { "State" } th { "Logs" } } }
                tbody {
                    @for l in &recent {
                        @let lname = ns_name(&l.metadata).1;
                        tr data-lease=(key_text(ns, lname)) {
                            td { (lname) }
                            td { (l.spec.client_ref.name) }
                            td { (time_cell(created(&l.metadata), now)) }
                            td { @if l.is_ended() { "ended: " (how_ended(l)) } @else if l.assigned_exporter().is_some() { "active" } @else { "waiting" } }
                            td { a href={"/ui/exporters/" (enc(ns)) "/" (enc(name)) "?lease=" (enc(lname))} { "log lines" } }
                        }
                    }
                }
            }
        }
        h2 { "Hook runs" }
        p class="note" {
            "The last " (crate::hook_history::RUNS_KEPT) " beforeLease and afterLease hook "
            "runs, newest first, from the statuses the exporter reported; the output is the "
            "hook's lines the exporter pushed with its lease's log entries (log gathering; "
            "exporters that push none, such as upstream's, show the status message only). "
            "Kept in the controller's memory: a restart forgets them."
        }
        @if hook_runs.is_empty() {
            p class="muted" id="hooks" { "No hook run since this controller started." }
        } @else {
            div class="scroll" {
                table id="hooks" {
                    thead { tr { th { "Started" } th { "Ended" } th { "Hook" } th { "Lease" } th { "Result" } th { "Output" } } }
                    tbody {
                        @for run in &hook_runs {
                            @let (lines, cut) = output_of(run);
                            tr data-hook=(run.kind.as_str()) data-result=(run.result.as_str())
                                data-lease=[run.lease.as_deref().map(|l| key_text(ns, l))] {
                                td { (time_cell(Some(run.start), now)) }
                                td { @match run.end { Some(e) => (time_cell(Some(e), now)), None => span class="muted" { "running" } } }
                                td { (run.kind.as_str()) }
                                td { (run.lease.as_deref().unwrap_or("-")) }
                                td { span class={"result " (run.result.as_str())} { (run.result.as_str()) } }
                                td {
                                    @if !run.message.is_empty() { p class="message" { (run.message) } }
                                    @if !lines.is_empty() {
                                        pre class="output" { @for l in &lines { (l) "\n" } }
                                    }
                                    @if cut { p class="note" { "(output cut at " (HOOK_OUTPUT_LINES) " lines / " (HOOK_OUTPUT_BYTES / 1024) " KiB)" } }
                                }
                            }
                        }
                    }
                }
            }
        }
        h2 { "Log lines" @if let Some(l) = &log_lease { " of lease " (l) } }
        @match (logs, &story) {
            (None, _) => p class="note" id="logs" { "Log gathering is off on this controller (--lease-logs)." },
            (_, None) => p class="note" id="logs" { "No log lines are kept for this exporter's recent leases (the controller keeps what exporters push, in memory, for a day)." },
            (_, Some(s)) => {
                @if s.dropped > 0 { p class="note" { (s.dropped) " entries were dropped (the per-lease bound)." } }
                div class="scroll" {
                    table id="logs" class="logs" {
                        thead { tr { th { "Time" } th { "Severity" } th { "Component" } th { "Operation" } th { "Message" } } }
                        tbody {
                            @for entry in s.entries.iter().rev().take(LOG_LINES) {
                                tr class={"sev-" (entry.severity)} {
                                    td { (entry_time(entry)) } td { (entry.severity) } td { (entry.component) }
                                    td { (entry.driver_type) @if !entry.operation.is_empty() { "." (entry.operation) } }
                                    td { (entry.message) }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Pools

/// `GET /ui/pools`: the ExporterSets.
pub async fn pools<S: Store>(State(ui): UiState<S>, headers: HeaderMap) -> Response {
    let login = match login::page_login(&ui, &headers).await {
        Ok(l) => l,
        Err(r) => return r,
    };
    ui.view.synced(SYNC_WAIT).await;
    let content = pools_content(&ui, Timestamp::now());
    page(
        &headers,
        &login,
        "Pools",
        Nav::Pools,
        "pools exporters",
        content,
    )
    .into_response()
}

fn pools_content<S: Store>(ui: &Ui<S>, now: Timestamp) -> Markup {
    let sets: Vec<Arc<ExporterSet>> = View::all(&ui.view.sets);
    html! {
        h1 { "Pools" }
        @if sets.is_empty() {
            p class="muted" { "No ExporterSet (see docs/virtual-pools.md)." }
        }
        div class="scroll" {
            table id="pools" {
                thead { tr {
                    th { "ExporterSet" } th { "Class" } th { "Replicas" } th { "Ready" }
                    th { "Available" } th { "Leased" } th { "Min / max" } th { "Conditions" }
                } }
                tbody {
                    @for s in &sets {
                        @let (ns, name) = ns_name(&s.metadata);
                        @let st = s.status.clone().unwrap_or_default();
                        tr data-pool=(key_text(ns, name)) {
                            td { (name) " " span class="ns" { (ns) } }
                            td { (s.spec.virtual_target_class_name) }
                            td class="replicas" { (st.replicas) }
                            td class="ready" { (st.ready_replicas) }
                            td class="available" { (st.available_replicas) }
                            td class="leased" { (st.leased_replicas) }
                            td { (s.spec.min()) " / " (s.spec.max_replicas.unwrap_or(4)) }
                            td {
                                @for cond in &st.conditions {
                                    span class="label" title=(cond.message) { (cond.type_) "=" (cond.status) } " "
                                }
                            }
                        }
                    }
                }
            }
        }
        @for s in &sets {
            @let (ns, name) = ns_name(&s.metadata);
            @let decisions = ui.state.pool_decisions.recent(ns, name);
            h2 { "Scaling decisions of " (key_text(ns, name)) }
            @if decisions.is_empty() {
                p class="muted" { "None since this controller started (they are kept in memory)." }
            } @else {
                table class="decisions" data-pool=(key_text(ns, name)) {
                    thead { tr { th { "When" } th { "Action" } th { "Replica" } th { "Why" } } }
                    tbody {
                        @for d in decisions.iter().rev() {
                            tr { td { (time_cell(Some(d.time), now)) } td { (d.action.as_str()) }
                                 td { (d.replica.clone().unwrap_or_default()) } td { (d.reason) } }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(enc("a=b,c!=d e"), "a%3Db%2Cc%21%3Dd%20e");
        assert_eq!(enc("plain-1.x_~"), "plain-1.x_~");
    }

    #[test]
    fn fleet_queries_are_checked_and_clamped() {
        let q = |page: &str, per: &str, sel: &str, sort: &str| FleetQuery {
            page: Some(page.into()),
            per_page: Some(per.into()),
            selector: Some(sel.into()),
            q: None,
            sort: Some(sort.into()),
        };
        let (f, _) = q("0", "100000", "a=b", "status")
            .check()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (f.page, f.per_page, f.sort),
            (1, MAX_PER_PAGE, Sort::Status)
        );
        assert!(q("x", "", "", "").check().unwrap_err().contains("page"));
        assert!(q("99999999999999999999999", "", "", "").check().is_err());
        assert!(
            q("1", "", "a in (", "")
                .check()
                .unwrap_err()
                .contains("selector")
        );
        assert!(
            q("1", "", "", "bogus")
                .check()
                .unwrap_err()
                .contains("sort")
        );
        assert!(FleetQuery::default().check().is_ok());
    }

    #[test]
    fn durations_and_positions_read_well() {
        assert_eq!(span(SignedDuration::from_secs(59)), "59s");
        assert_eq!(span(SignedDuration::from_secs(3 * 3600 + 120)), "3h 2m");
        assert_eq!(span(SignedDuration::from_secs(-90)), "1m 30s");
        let l = Lease {
            status: Some(crate::objects::LeaseStatus {
                conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                    type_: c::PENDING.into(),
                    status: c::TRUE.into(),
                    reason: "NotAvailable".into(),
                    message: "All busy (position 3 in queue)".into(),
                    last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        Timestamp::UNIX_EPOCH,
                    ),
                    observed_generation: None,
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(queue_position(&l), Some(3));
        assert_eq!(queue_position(&Lease::default()), None);
    }
}
