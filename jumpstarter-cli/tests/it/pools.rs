//! Virtual target pools end to end: an in-process controller whose pool engine runs each
//! replica of an ExporterSet (class `provisioner: local`, a MockPower template) as a real
//! `jmp run` child, and `jmp shell` clients leasing by the template's labels.
//!
//! Each test's controller stops its replicas when it stops, and they get SIGTERM when the
//! test's runtime ends anyway (`exit_with_controller`), so a failing test leaves none behind.

use std::time::Duration;

use jumpstarter_controller::{
    ControllerConfig, LabelSelector,
    objects::{
        Exporter, ExporterStatusValue,
        virtualtarget::{ExporterSet, LABEL_EXPORTER_SET, VirtualTargetClass},
    },
    pools::decisions::Action,
    store::{ListParams, Store},
};

use crate::{
    JMP,
    distributed::{Lab, finish, lab_with, shell},
};

/// Controller settings: the local provisioner runs this build's `jmp`; with `keep`, replicas
/// outlive the controller (for the restart test), else they stop with it.
fn local_pools(keep: bool) -> impl FnOnce(&mut ControllerConfig) {
    move |c| {
        let pools = c.pools.as_mut().expect("pools are on by default");
        pools.stop_replicas_on_exit = !keep;
        let local = pools.local.as_mut().expect("the local provisioner is on");
        local.jmp = Some(JMP.into());
        local.exit_with_controller = !keep;
        local.stop_timeout = Duration::from_secs(5);
    }
}

/// Creates the class `local` and the ExporterSet `name` whose replicas carry `pool=<name>`,
/// with `spec` merged over the basics.
async fn make_pool(lab: &Lab, name: &str, spec: serde_json::Value) {
    let store = &lab.ctl().state.store;
    if store
        .get::<VirtualTargetClass>("default", "local")
        .await
        .unwrap()
        .is_none()
    {
        let class: VirtualTargetClass = serde_json::from_value(serde_json::json!({
            "apiVersion": "virtualtarget.jumpstarter.dev/v1alpha1",
            "kind": "VirtualTargetClass",
            "metadata": {"name": "local", "namespace": "default"},
            "spec": {"provisioner": "local"}
        }))
        .unwrap();
        store.create(&class).await.unwrap();
    }
    let mut body = serde_json::json!({
        "virtualTargetClassName": "local",
        "selector": {"matchLabels": {"pool": name}},
        "template": {
            "metadata": {"labels": {"pool": name}},
            "spec": {"drivers": [
                {"name": "power", "type": "jumpstarter_driver_power.driver.MockPower"}
            ]}
        }
    });
    for (k, v) in spec.as_object().unwrap() {
        body[k] = v.clone();
    }
    let set: ExporterSet = serde_json::from_value(serde_json::json!({
        "apiVersion": "virtualtarget.jumpstarter.dev/v1alpha1",
        "kind": "ExporterSet",
        "metadata": {"name": name, "namespace": "default"},
        "spec": body
    }))
    .unwrap();
    store.create(&set).await.unwrap();
}

async fn set_of(lab: &Lab, name: &str) -> ExporterSet {
    lab.ctl()
        .state
        .store
        .get("default", name)
        .await
        .unwrap()
        .unwrap()
}

async fn replicas(lab: &Lab, set: &str) -> Vec<Exporter> {
    let sel = LabelSelector::parse(&format!("{LABEL_EXPORTER_SET}={set}")).unwrap();
    lab.ctl()
        .state
        .store
        .list::<Exporter>(Some("default"), &sel, &ListParams::default())
        .await
        .unwrap()
        .items
}

fn name(e: &Exporter) -> &str {
    e.metadata.name.as_deref().unwrap()
}

fn available(e: &Exporter) -> bool {
    e.spec.enabled != Some(false)
        && e.status.as_ref().and_then(|s| s.exporter_status) == Some(ExporterStatusValue::Available)
}

/// The engine's recent decisions about `set`, one line each.
fn decisions(lab: &Lab, set: &str) -> Vec<(Action, String, String)> {
    lab.ctl()
        .state
        .pool_decisions
        .recent("default", set)
        .into_iter()
        .map(|d| (d.action, d.replica.unwrap_or_default(), d.reason))
        .collect()
}

/// What to show when a wait fails: the decisions, the replicas and their logs.
async fn story(lab: &Lab, set: &str) -> String {
    let mut out = format!("decisions: {:#?}\n", decisions(lab, set));
    for e in replicas(lab, set).await {
        out += &format!(
            "replica {} enabled={:?} status={:?}\n{}\n",
            name(&e),
            e.spec.enabled,
            e.status.as_ref().and_then(|s| s.exporter_status),
            lab.log(&format!("data/pools/default/{}/exporter.log", name(&e)))
        );
    }
    out
}

/// Waits (at most 60 s) until the replicas of `set` satisfy `ok`, and returns them.
async fn wait_replicas(
    lab: &Lab,
    set: &str,
    what: &str,
    ok: impl Fn(&[Exporter]) -> bool,
) -> Vec<Exporter> {
    for _ in 0..600 {
        let rs = replicas(lab, set).await;
        if ok(&rs) {
            return rs;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("pool {set}: never {what}\n{}", story(lab, set).await);
}

/// `jmp shell -l pool=<set> -- j power on`: the exporter it got.
async fn lease_once(lab: &Lab, client: &std::path::Path, set: &str) -> String {
    let (code, out, err) = finish(shell(
        lab,
        client,
        &["-l", &format!("pool={set}"), "--duration", "5m"],
        "j power on && echo \"exporter=$JMP_EXPORTER\"",
    ))
    .await;
    assert_eq!(code, 0, "{out}{err}\n{}", story(lab, set).await);
    out.split("exporter=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no exporter in {out}"))
        .to_string()
}

/// The pid in a replica's `jmp.pid`.
fn replica_pid(lab: &Lab, replica: &str) -> u32 {
    let text = lab.log(&format!("data/pools/default/{replica}/jmp.pid"));
    text.split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("replica {replica} has no pid file: {text:?}"))
}

fn alive(pid: u32) -> bool {
    // A zombie is not alive: the controller reaps its children.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_pool_keeps_two_exporters_online_and_scales_to_zero_after_the_cooldown() {
    let mut lab = lab_with(local_pools(false)).await;
    make_pool(
        &lab,
        "warm",
        serde_json::json!({"minAvailableReplicas": 2, "maxReplicas": 4, "scaleDownCooldown": "1s"}),
    )
    .await;
    let rs = wait_replicas(&lab, "warm", "2 available", |rs| {
        rs.iter().filter(|e| available(e)).count() == 2
    })
    .await;
    assert_eq!(rs.len(), 2, "{}", story(&lab, "warm").await);
    for e in &rs {
        assert!(name(e).starts_with("warm-"), "{}", name(e));
        assert_eq!(e.metadata.labels.as_ref().unwrap()["pool"], "warm");
    }
    // The status says so.
    let mut status = None;
    for _ in 0..100 {
        status = set_of(&lab, "warm").await.status;
        if status.as_ref().is_some_and(|s| s.available_replicas == 2) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = status.unwrap();
    assert_eq!(
        (
            status.replicas,
            status.ready_replicas,
            status.available_replicas
        ),
        (2, 2, 2)
    );
    assert_eq!(status.selector.as_deref(), Some("pool=warm"));
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        "{status:?}"
    );
    let pids: Vec<u32> = rs.iter().map(|e| replica_pid(&lab, name(e))).collect();

    // No warm pool wanted any more: both go once idle for the cooldown.
    let mut set = set_of(&lab, "warm").await;
    set.spec.min_available_replicas = Some(0);
    lab.ctl().state.store.update(&set).await.unwrap();
    wait_replicas(&lab, "warm", "scaled to zero", |rs| rs.is_empty()).await;
    let scaled_down = decisions(&lab, "warm")
        .iter()
        .filter(|(a, _, _)| *a == Action::ScaleDown)
        .count();
    assert!(scaled_down >= 2, "{:#?}", decisions(&lab, "warm"));
    for _ in 0..100 {
        if pids.iter().all(|p| !alive(*p)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(pids.iter().all(|p| !alive(*p)), "replica processes left");
    lab.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_lease_scales_an_empty_pool_up_and_exit_and_replace_gives_the_next_lease_a_fresh_exporter()
 {
    let mut lab = lab_with(local_pools(false)).await;
    let client = lab.client("ci").await;
    make_pool(
        &lab,
        "burst",
        serde_json::json!({"scaleDownCooldown": "1h"}),
    )
    .await;
    // The engine has looked at the set (its status is written) and made nothing.
    for _ in 0..100 {
        if set_of(&lab, "burst").await.status.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(set_of(&lab, "burst").await.status.is_some());
    assert!(replicas(&lab, "burst").await.is_empty());

    let first = lease_once(&lab, &client, "burst").await;
    assert!(first.starts_with("burst-"), "{first}");
    let second = lease_once(&lab, &client, "burst").await;
    assert!(second.starts_with("burst-"), "{second}");
    assert_ne!(first, second, "ExitAndReplace: each lease a fresh exporter");
    // The first one exited after its lease and was removed.
    wait_replicas(&lab, "burst", "without the first replica", |rs| {
        rs.iter().all(|e| name(e) != first)
    })
    .await;
    assert!(
        decisions(&lab, "burst")
            .iter()
            .any(|(a, r, _)| *a == Action::Replace && *r == first),
        "{:#?}",
        decisions(&lab, "burst")
    );
    lab.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_that_waits_for_the_first_consumer_keeps_no_warm_pool() {
    let mut lab = lab_with(local_pools(false)).await;
    let client = lab.client("ci").await;
    let class: VirtualTargetClass = serde_json::from_value(serde_json::json!({
        "apiVersion": "virtualtarget.jumpstarter.dev/v1alpha1",
        "kind": "VirtualTargetClass",
        "metadata": {"name": "ondemand", "namespace": "default"},
        "spec": {"provisioner": "local", "bindingMode": "WaitForFirstConsumer"}
    }))
    .unwrap();
    lab.ctl().state.store.create(&class).await.unwrap();
    make_pool(
        &lab,
        "lazy",
        serde_json::json!({
            "virtualTargetClassName": "ondemand",
            "minAvailableReplicas": 2,
            "recycleStrategy": "InPlaceReuse",
            "scaleDownCooldown": "1h"
        }),
    )
    .await;
    // The set is valid and looked at, and its warm pool of 2 is not made.
    wait_condition(&lab, "lazy", "Invalid", "False").await;
    assert!(replicas(&lab, "lazy").await.is_empty());
    // A waiting lease gets one, and only one is made.
    let first = lease_once(&lab, &client, "lazy").await;
    assert!(first.starts_with("lazy-"), "{first}");
    let names: Vec<String> = replicas(&lab, "lazy")
        .await
        .iter()
        .map(|e| name(e).to_string())
        .collect();
    assert_eq!(names, vec![first], "no warm replica beside the leased one");
    lab.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_place_reuse_serves_the_next_lease_with_the_same_exporter() {
    let mut lab = lab_with(local_pools(false)).await;
    let client = lab.client("ci").await;
    make_pool(
        &lab,
        "reuse",
        serde_json::json!({"recycleStrategy": "InPlaceReuse", "maxReplicas": 1}),
    )
    .await;
    let first = lease_once(&lab, &client, "reuse").await;
    let second = lease_once(&lab, &client, "reuse").await;
    assert_eq!(first, second);
    let rs = wait_replicas(&lab, "reuse", "available again", |rs| {
        rs.len() == 1 && available(&rs[0])
    })
    .await;
    assert_eq!(name(&rs[0]), first);
    let pid = replica_pid(&lab, &first);

    // Deleting the set stops its replicas and deletes their Exporters.
    lab.ctl()
        .state
        .store
        .delete::<ExporterSet>("default", "reuse", None)
        .await
        .unwrap();
    wait_replicas(&lab, "reuse", "gone with the set", |rs| rs.is_empty()).await;
    for _ in 0..100 {
        if !alive(pid) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!alive(pid), "the replica outlived its set");
    lab.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sets_that_cannot_scale_say_why_in_their_conditions_and_make_nothing() {
    let mut lab = lab_with(local_pools(false)).await;
    // Invalid: min above max.
    make_pool(
        &lab,
        "bad",
        serde_json::json!({"minReplicas": 3, "maxReplicas": 2}),
    )
    .await;
    // Its class names a provisioner this controller does not have.
    let class: VirtualTargetClass = serde_json::from_value(serde_json::json!({
        "apiVersion": "virtualtarget.jumpstarter.dev/v1alpha1",
        "kind": "VirtualTargetClass",
        "metadata": {"name": "cloud", "namespace": "default"},
        "spec": {"provisioner": "corellium.jumpstarter.dev"}
    }))
    .unwrap();
    lab.ctl().state.store.create(&class).await.unwrap();
    make_pool(
        &lab,
        "elsewhere",
        serde_json::json!({"virtualTargetClassName": "cloud", "minAvailableReplicas": 1}),
    )
    .await;
    // Its class asks for what no provisioner here does (keep replicas' resources).
    let class: VirtualTargetClass = serde_json::from_value(serde_json::json!({
        "apiVersion": "virtualtarget.jumpstarter.dev/v1alpha1",
        "kind": "VirtualTargetClass",
        "metadata": {"name": "keeper", "namespace": "default"},
        "spec": {"provisioner": "local", "reclaimPolicy": "Retain"}
    }))
    .unwrap();
    lab.ctl().state.store.create(&class).await.unwrap();
    make_pool(
        &lab,
        "retained",
        serde_json::json!({"virtualTargetClassName": "keeper", "minAvailableReplicas": 1}),
    )
    .await;
    // Its class does not exist.
    make_pool(
        &lab,
        "classless",
        serde_json::json!({"virtualTargetClassName": "missing", "minAvailableReplicas": 1}),
    )
    .await;
    let condition = |set: &ExporterSet, type_: &str| {
        set.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_).cloned())
    };
    let mut seen = Vec::new();
    for _ in 0..100 {
        seen = Vec::new();
        for (set, type_) in [
            ("bad", "Invalid"),
            ("elsewhere", "ProvisionerUnavailable"),
            ("classless", "Invalid"),
            ("retained", "Invalid"),
        ] {
            let c = condition(&set_of(&lab, set).await, type_);
            seen.push(c.filter(|c| c.status == "True"));
        }
        if seen.iter().all(Option::is_some) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let messages: Vec<String> = seen
        .into_iter()
        .map(|c| c.expect("condition set").message)
        .collect();
    assert!(messages[0].contains("spec.minReplicas"), "{messages:?}");
    assert!(
        messages[1].contains("\"corellium.jumpstarter.dev\"")
            && messages[1].contains("available: local"),
        "{messages:?}"
    );
    assert!(
        messages[2].contains("spec.virtualTargetClassName") && messages[2].contains("missing"),
        "{messages:?}"
    );
    assert!(
        messages[3].contains("VirtualTargetClass keeper: spec.reclaimPolicy"),
        "{messages:?}"
    );
    for set in ["bad", "elsewhere", "classless", "retained"] {
        assert!(replicas(&lab, set).await.is_empty(), "{set}");
    }
    lab.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_with_sigkill_is_replaced() {
    let mut lab = lab_with(local_pools(false)).await;
    make_pool(
        &lab,
        "sturdy",
        serde_json::json!({"minAvailableReplicas": 1}),
    )
    .await;
    let rs = wait_replicas(&lab, "sturdy", "1 available", |rs| {
        rs.len() == 1 && available(&rs[0])
    })
    .await;
    let killed = name(&rs[0]).to_string();
    let pid = replica_pid(&lab, &killed);
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let rs = wait_replicas(&lab, "sturdy", "replaced", |rs| {
        rs.len() == 1 && name(&rs[0]) != killed && available(&rs[0])
    })
    .await;
    assert!(
        decisions(&lab, "sturdy")
            .iter()
            .any(|(a, r, why)| *a == Action::Replace && *r == killed && why.contains("failed")),
        "{:#?}",
        decisions(&lab, "sturdy")
    );
    assert!(!alive(pid));
    assert_ne!(name(&rs[0]), killed);
    lab.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_controller_adopts_its_replicas_keeps_the_held_lease_and_leaks_nothing() {
    let mut lab = lab_with(local_pools(true)).await;
    let client = lab.client("ci").await;
    make_pool(&lab, "kept", serde_json::json!({"minAvailableReplicas": 1})).await;
    wait_replicas(&lab, "kept", "1 available", |rs| {
        rs.len() == 1 && available(&rs[0])
    })
    .await;
    // A lease held across the restart: the command waits for `go`, then drives the board.
    let held = lab.path("held");
    let go = lab.path("go");
    let child = shell(
        &lab,
        &client,
        &["-l", "pool=kept", "--duration", "5m"],
        &format!(
            "echo \"$JMP_EXPORTER\" > {held}; for i in $(seq 600); do [ -f {go} ] && break; \
             sleep 0.1; done; j power on && echo \"exporter=$JMP_EXPORTER\"",
            held = held.display(),
            go = go.display()
        ),
    );
    for _ in 0..600 {
        if lab.log("held").trim().starts_with("kept-") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let leased = lab.log("held").trim().to_string();
    assert!(leased.starts_with("kept-"), "{}", story(&lab, "kept").await);
    // The warm pool is refilled beside the leased replica.
    let before = wait_replicas(&lab, "kept", "refilled", |rs| {
        rs.len() == 2 && rs.iter().any(|e| name(e) != leased && available(e))
    })
    .await;
    let mut names: Vec<String> = before.iter().map(|e| name(e).to_string()).collect();
    names.sort();
    let pids: Vec<u32> = names.iter().map(|n| replica_pid(&lab, n)).collect();

    // Restarted (replicas stop with it from now on).
    lab.restart_with(local_pools(false)).await;
    // Both replicas are adopted: same Exporters, same processes, none replaced.
    for _ in 0..300 {
        let adopted = decisions(&lab, "kept")
            .iter()
            .filter(|(a, _, _)| *a == Action::Adopt)
            .count();
        if adopted == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = decisions(&lab, "kept");
    let mut adopted: Vec<String> = after
        .iter()
        .filter(|(a, _, _)| *a == Action::Adopt)
        .map(|(_, r, _)| r.clone())
        .collect();
    adopted.sort();
    assert_eq!(adopted, names, "{after:#?}");
    assert!(
        after
            .iter()
            .all(|(a, _, _)| !matches!(a, Action::Replace | Action::Reap | Action::ScaleUp)),
        "{after:#?}"
    );
    let mut now: Vec<String> = replicas(&lab, "kept")
        .await
        .iter()
        .map(|e| name(e).to_string())
        .collect();
    now.sort();
    assert_eq!(now, names);
    assert!(pids.iter().all(|p| alive(*p)));

    // The held lease goes on on the same exporter.
    std::fs::write(&go, "").unwrap();
    let (code, out, err) = finish(child).await;
    assert_eq!(code, 0, "{out}{err}\n{}", story(&lab, "kept").await);
    assert!(out.contains(&format!("exporter={leased}")), "{out}");

    // Stopped: no replica process is left.
    lab.shutdown().await;
    for _ in 0..100 {
        if pids.iter().all(|p| !alive(*p)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(pids.iter().all(|p| !alive(*p)), "replica processes left");
    let left: Vec<_> = std::fs::read_dir(lab.path("data/pools/default"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "replica directories left: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_that_fail_before_becoming_ready_are_retried_with_a_growing_wait() {
    let mut lab = lab_with(local_pools(false)).await;
    // `jmp run` refuses this config at once (its ref names no driver).
    make_pool(
        &lab,
        "broken",
        serde_json::json!({
            "minAvailableReplicas": 1,
            "template": {
                "metadata": {"labels": {"pool": "broken"}},
                "spec": {"drivers": [{"name": "alias", "ref": "nowhere"}]}
            }
        }),
    )
    .await;
    let blocked = |lab: &Lab| {
        decisions(lab, "broken")
            .into_iter()
            .filter(|(a, _, why)| *a == Action::Blocked && why.contains("failed before"))
            .map(|(_, _, why)| why)
            .collect::<Vec<_>>()
    };
    for _ in 0..300 {
        if blocked(&lab).len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let said = blocked(&lab);
    assert!(said.len() >= 2, "{}", story(&lab, "broken").await);
    assert!(
        said[0].contains("1 replica(s) in a row") && said[0].contains("waits 1s"),
        "{said:?}"
    );
    assert!(
        said[1].contains("2 replica(s) in a row") && said[1].contains("waits 2s"),
        "{said:?}"
    );
    // Each failure is a replacement naming the exit status.
    let failed = decisions(&lab, "broken")
        .into_iter()
        .filter(|(a, _, why)| *a == Action::Replace && why.contains("failed"))
        .count();
    assert!(failed >= 2, "{}", story(&lab, "broken").await);
    // The status says why no replica is ready.
    let mut condition = None;
    for _ in 0..100 {
        condition = set_of(&lab, "broken").await.status.and_then(|s| {
            s.conditions
                .into_iter()
                .find(|c| c.type_ == "ProvisionerUnavailable" && c.status == "True")
        });
        if condition.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let condition = condition.expect("ProvisionerUnavailable while backing off");
    assert!(
        condition.message.contains("failed before becoming ready"),
        "{condition:?}"
    );
    lab.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_without_exporter_is_reaped_and_an_exporter_without_process_replaced() {
    let mut lab = lab_with(local_pools(true)).await;
    make_pool(
        &lab,
        "loose",
        serde_json::json!({"minAvailableReplicas": 1}),
    )
    .await;
    let rs = wait_replicas(&lab, "loose", "1 available", |rs| {
        rs.len() == 1 && available(&rs[0])
    })
    .await;
    let first = name(&rs[0]).to_string();
    let first_pid = replica_pid(&lab, &first);

    // Its Exporter deleted behind the engine's back: the process is stopped, a new one made.
    lab.ctl()
        .state
        .store
        .delete::<Exporter>("default", &first, None)
        .await
        .unwrap();
    let rs = wait_replicas(&lab, "loose", "refilled", |rs| {
        rs.len() == 1 && name(&rs[0]) != first && available(&rs[0])
    })
    .await;
    let second = name(&rs[0]).to_string();
    assert!(
        decisions(&lab, "loose")
            .iter()
            .any(|(a, r, _)| *a == Action::Reap && *r == first),
        "{:#?}",
        decisions(&lab, "loose")
    );
    for _ in 0..100 {
        if !alive(first_pid) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!alive(first_pid), "the reaped replica still runs");

    // Its process dies while the controller is down: the restarted one replaces it.
    let second_pid = replica_pid(&lab, &second);
    let addresses = lab.stop().await;
    assert!(alive(second_pid), "replicas outlive the controller here");
    let status = std::process::Command::new("kill")
        .args(["-KILL", &second_pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    lab.start_again(addresses, local_pools(false)).await;
    wait_replicas(&lab, "loose", "replaced after the restart", |rs| {
        rs.len() == 1 && name(&rs[0]) != second && available(&rs[0])
    })
    .await;
    assert!(
        decisions(&lab, "loose")
            .iter()
            .any(|(a, r, why)| *a == Action::Replace
                && *r == second
                && why.contains("nothing runs")),
        "{:#?}",
        decisions(&lab, "loose")
    );
    lab.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantined_replica_is_replaced_rather_than_left_quarantined() {
    let mut lab = lab_with(local_pools(false)).await;
    make_pool(&lab, "sick", serde_json::json!({"minAvailableReplicas": 1})).await;
    let rs = wait_replicas(&lab, "sick", "1 available", |rs| {
        rs.len() == 1 && available(&rs[0])
    })
    .await;
    let quarantined = name(&rs[0]).to_string();
    // As the controller marks an exporter whose health check failed `threshold` times.
    let mut e = rs[0].clone();
    jumpstarter_controller::objects::set_condition(
        &mut e.status.as_mut().unwrap().conditions,
        "Healthy",
        false,
        "HealthCheckFailed",
        "3 health checks failed in a row",
        None,
        jiff::Timestamp::now(),
    );
    lab.ctl().state.store.update_status(&e).await.unwrap();
    wait_replicas(&lab, "sick", "replaced", |rs| {
        rs.len() == 1 && name(&rs[0]) != quarantined && available(&rs[0])
    })
    .await;
    assert!(
        decisions(&lab, "sick")
            .iter()
            .any(|(a, r, why)| *a == Action::Replace
                && *r == quarantined
                && why.contains("quarantined")),
        "{:#?}",
        decisions(&lab, "sick")
    );
    lab.shutdown().await;
}

/// The status of condition `type_` of set `set` (`None`: not written yet).
async fn condition_status(lab: &Lab, set: &str, type_: &str) -> Option<String> {
    set_of(lab, set)
        .await
        .status
        .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == type_))
        .map(|c| c.status)
}

async fn wait_condition(lab: &Lab, set: &str, type_: &str, want: &str) {
    for _ in 0..300 {
        if condition_status(lab, set, type_).await.as_deref() == Some(want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "pool {set}: {type_} never {want}: {:?}\n{}",
        set_of(lab, set).await.status,
        story(lab, set).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_max_replicas_a_waiting_lease_is_scaling_limited_and_served_when_one_frees() {
    let mut lab = lab_with(local_pools(false)).await;
    let client = lab.client("ci").await;
    make_pool(
        &lab,
        "one",
        serde_json::json!({"recycleStrategy": "InPlaceReuse", "maxReplicas": 1}),
    )
    .await;
    let go = lab.path("go");
    let holder = shell(
        &lab,
        &client,
        &["-l", "pool=one", "--duration", "5m"],
        &format!(
            "echo \"$JMP_EXPORTER\" > held; for i in $(seq 600); do [ -f {} ] && break; \
             sleep 0.1; done; j power on",
            go.display()
        ),
    );
    for _ in 0..600 {
        if lab.log("held").trim().starts_with("one-") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let held = lab.log("held").trim().to_string();
    assert!(held.starts_with("one-"), "{}", story(&lab, "one").await);
    // A second lease waits: the pool is at its ceiling.
    let waiter = shell(
        &lab,
        &client,
        &["-l", "pool=one", "--duration", "5m"],
        "j power on && echo \"exporter=$JMP_EXPORTER\"",
    );
    wait_condition(&lab, "one", "ScalingLimited", "True").await;
    assert_eq!(replicas(&lab, "one").await.len(), 1);
    // The first lease ends; the same replica serves the second.
    std::fs::write(&go, "").unwrap();
    let (code, out, err) = finish(holder).await;
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = finish(waiter).await;
    assert_eq!(code, 0, "{out}{err}\n{}", story(&lab, "one").await);
    assert!(out.contains(&format!("exporter={held}")), "{out}");
    wait_condition(&lab, "one", "ScalingLimited", "False").await;
    lab.shutdown().await;
}

/// A lease on a pool's labels whose client no access policy grants the pool's exporters ends
/// (no access) instead of waiting, and the pool makes no replica for it; once a policy grants
/// them, the same lease is served by a new replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_the_access_policies_deny_makes_no_replica_and_ends() {
    use jumpstarter_controller::objects::ExporterAccessPolicy;
    let mut lab = lab_with(local_pools(false)).await;
    let client = lab.client("ci").await;
    make_pool(
        &lab,
        "guarded",
        serde_json::json!({"scaleDownCooldown": "1h"}),
    )
    .await;
    let policy = |client_selector: serde_json::Value| -> ExporterAccessPolicy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "jumpstarter.dev/v1alpha1",
            "kind": "ExporterAccessPolicy",
            "metadata": {"name": "guarded", "namespace": "default"},
            "spec": {
                "exporterSelector": {"matchLabels": {"pool": "guarded"}},
                "policies": [{"priority": 1, "from": [{"clientSelector": client_selector}]}]
            }
        }))
        .unwrap()
    };
    let store = &lab.ctl().state.store;
    store
        .create(&policy(
            serde_json::json!({"matchLabels": {"team": "other"}}),
        ))
        .await
        .unwrap();
    for _ in 0..100 {
        if set_of(&lab, "guarded").await.status.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let (code, out, err) = finish(shell(
        &lab,
        &client,
        &["-l", "pool=guarded", "--duration", "5m"],
        "true",
    ))
    .await;
    assert_ne!(code, 0, "{out}{err}");
    assert!(
        err.contains("no exporters matching the selector"),
        "{err}\n{}",
        story(&lab, "guarded").await
    );
    assert!(replicas(&lab, "guarded").await.is_empty());
    assert!(
        !decisions(&lab, "guarded")
            .iter()
            .any(|(a, _, _)| *a == Action::ScaleUp),
        "{:#?}",
        decisions(&lab, "guarded")
    );

    // A rule for every client: the pool serves the lease.
    let mut open = policy(serde_json::json!({}));
    let stored: ExporterAccessPolicy = store.get("default", "guarded").await.unwrap().unwrap();
    open.metadata.resource_version = stored.metadata.resource_version;
    store.update(&open).await.unwrap();
    let got = lease_once(&lab, &client, "guarded").await;
    assert!(got.starts_with("guarded-"), "{got}");
    lab.shutdown().await;
}
