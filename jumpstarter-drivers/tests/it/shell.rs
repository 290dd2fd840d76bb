//! The Shell driver served by a real session, driven through the client library and `j`'s
//! command tree.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use futures::StreamExt;
use jumpstarter_core::{ClientError, Driver, driver::DriverArgs};
use jumpstarter_drivers::{Shell, ShellClient, ShellOutput};
use serde_json::json;

use crate::Served;

fn shell(config: serde_json::Value) -> Arc<dyn Driver> {
    Shell::from_args(&DriverArgs { config }).unwrap()
}

async fn client(served: &Served) -> ShellClient {
    let session = served.client().await;
    ShellClient(session.driver("sh").unwrap())
}

/// Runs a method to its end: all stdout, all stderr, the exit code.
async fn collect(
    c: &ShellClient,
    method: &str,
    env: &[(&str, &str)],
    args: &[&str],
) -> Result<(String, String, i64), ClientError> {
    let env: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let mut s = c.call_method(method, &env, &args).await?;
    let (mut out, mut err, mut code) = (String::new(), String::new(), None);
    while let Some(item) = s.next().await {
        let ShellOutput {
            stdout,
            stderr,
            returncode,
        } = item?;
        assert!(code.is_none(), "an item after the exit code");
        out.push_str(&stdout);
        err.push_str(&stderr);
        code = returncode;
    }
    Ok((out, err, code.expect("no exit code")))
}

fn pid_alive(pid: u32) -> bool {
    // A zombie is as good as gone: it only waits for its parent to reap it.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| !r.trim_start().starts_with('Z'))
    })
}

async fn wait_gone(pid: u32) {
    for _ in 0..200 {
        if !pid_alive(pid) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("process {pid} is still running");
}

#[tokio::test]
async fn output_and_exit_code_stream_back() {
    let served = Served::start(vec![(
        "sh",
        shell(json!({"methods": {
            "both": "echo out; echo err >&2; exit 3",
            "ok": {"command": "printf 'é%.0s' 1 2", "description": "Prints"},
        }})),
    )]);
    let c = client(&served).await;
    assert_eq!(c.get_methods().await.unwrap(), ["both", "ok"]);
    assert_eq!(
        collect(&c, "both", &[], &[]).await.unwrap(),
        ("out\n".into(), "err\n".into(), 3)
    );
    assert_eq!(
        collect(&c, "ok", &[], &[]).await.unwrap(),
        ("éé".into(), String::new(), 0)
    );
}

#[tokio::test]
async fn arguments_reach_the_script_verbatim_never_through_a_shell() {
    let dir = tempfile::tempdir().unwrap();
    let served = Served::start(vec![(
        "sh",
        shell(json!({
            "methods": {"show": "printf '%s|' \"$0\" \"$@\""},
            "cwd": dir.path(),
        })),
    )]);
    let c = client(&served).await;
    let nasty = [
        "a b",
        "$(touch pwned)",
        "`touch pwned2`",
        "; touch pwned3",
        "'\"",
        "-n",
    ];
    let (out, _, code) = collect(&c, "show", &[], &nasty).await.unwrap();
    assert_eq!(code, 0);
    assert_eq!(out, format!("show|{}|", nasty.join("|")));
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "an argument ran as a command: {left:?}");
}

#[tokio::test]
async fn environment_variables_as_upstream_allows() {
    let dir = tempfile::tempdir().unwrap();
    let served = Served::start(vec![(
        "sh",
        shell(json!({
            "methods": {"env": "echo \"$GREETING $(pwd)\""},
            "cwd": dir.path(),
        })),
    )]);
    let c = client(&served).await;
    let (out, _, _) = collect(&c, "env", &[("GREETING", "hi there")], &[])
        .await
        .unwrap();
    let cwd = dir.path().canonicalize().unwrap();
    assert_eq!(out, format!("hi there {}\n", cwd.display()));
    for (bad, msg) in [
        (
            "PATH",
            "Environment variable 'PATH' is blocked for security reasons",
        ),
        (
            "LD_AUDIT",
            "Environment variable 'LD_AUDIT' is blocked for security reasons",
        ),
        ("1X", "Invalid environment variable name: 1X"),
    ] {
        let e = collect(&c, "env", &[(bad, "x")], &[]).await.unwrap_err();
        assert!(e.to_string().contains(msg), "{bad}: {e}");
    }
    // Refused calls change nothing; the driver still works.
    assert_eq!(collect(&c, "env", &[], &[]).await.unwrap().2, 0);
}

#[tokio::test]
async fn unknown_methods_and_bad_arguments_are_refused() {
    let served = Served::start(vec![("sh", shell(json!({"methods": {"a": "true"}})))]);
    let c = client(&served).await;
    let e = collect(&c, "nope", &[], &[]).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("Method 'nope' not found in available methods: [\"a\"]"),
        "{e}"
    );
    let e =
        c.0.streaming_call::<ShellOutput>("call_method", (String::from("a"), 5))
            .await;
    let e = match e {
        Ok(mut s) => s.next().await.unwrap().unwrap_err(),
        Err(e) => e,
    };
    assert!(e.to_string().contains("env must be a mapping"), "{e}");
}

#[tokio::test]
async fn output_arrives_while_the_method_runs() {
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let served = Served::start(vec![(
        "sh",
        shell(json!({"methods": {
            "wait": "echo ready; while [ ! -e \"$1\" ]; do sleep 0.05; done; echo done",
        }})),
    )]);
    let c = client(&served).await;
    let mut s = c
        .call_method(
            "wait",
            &BTreeMap::new(),
            &[go.to_string_lossy().into_owned()],
        )
        .await
        .unwrap();
    // "ready" comes before the method can finish: it waits for the file we create next.
    let first = s.next().await.unwrap().unwrap();
    assert_eq!(first.stdout, "ready\n");
    assert_eq!(first.returncode, None);
    std::fs::write(&go, b"").unwrap();
    let mut rest = String::new();
    let mut code = None;
    while let Some(item) = s.next().await {
        let item = item.unwrap();
        rest.push_str(&item.stdout);
        code = item.returncode.or(code);
    }
    assert_eq!((rest.as_str(), code), ("done\n", Some(0)));
}

#[tokio::test]
async fn a_method_past_its_timeout_is_killed_with_its_children() {
    let served = Served::start(vec![(
        "sh",
        shell(json!({
            "methods": {"slow": {"command": "sleep 60 & echo $!; wait", "timeout": 1}},
            "timeout": 100,
        })),
    )]);
    let c = client(&served).await;
    let (out, err, code) = collect(&c, "slow", &[], &[]).await.unwrap();
    assert_eq!(code, 199);
    assert!(err.contains("Timeout expired while running slow"), "{err}");
    let pid: u32 = out.trim().parse().unwrap();
    wait_gone(pid).await;
}

#[tokio::test]
async fn a_client_that_goes_away_ends_the_method() {
    let served = Served::start(vec![(
        "sh",
        shell(json!({"methods": {"hang": "sleep 60 & echo $!; wait"}})),
    )]);
    let c = client(&served).await;
    let mut s = c.call_method("hang", &BTreeMap::new(), &[]).await.unwrap();
    let first = s.next().await.unwrap().unwrap();
    let pid: u32 = first.stdout.trim().parse().unwrap();
    assert!(pid_alive(pid));
    drop(s);
    wait_gone(pid).await;
}

#[tokio::test]
async fn a_missing_working_directory_is_a_clear_error() {
    let served = Served::start(vec![(
        "sh",
        shell(json!({"methods": {"a": "true"}, "cwd": "/nonexistent/dir"})),
    )]);
    let c = client(&served).await;
    let e = collect(&c, "a", &[], &[]).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("Working directory does not exist: /nonexistent/dir"),
        "{e}"
    );
}

#[tokio::test]
async fn j_lists_each_method_with_its_description() {
    let served = Served::start(vec![(
        "sh",
        shell(json!({"methods": {
            "flash-it": {"command": "true", "description": "Flash the board"},
            "plain": "true",
        }})),
    )]);
    let session = served.client().await;
    let mut j = jumpstarter_drivers::j_command(&session).await;
    let sh = j.find_subcommand_mut("sh").unwrap();
    let help = sh.render_help().to_string();
    assert!(
        help.contains("flash-it") && help.contains("Flash the board"),
        "{help}"
    );
    assert!(
        help.contains("plain") && help.contains("Execute the plain shell method"),
        "{help}"
    );
    // A successful method through j's own runner.
    let matches = jumpstarter_drivers::j_command(&session)
        .await
        .try_get_matches_from(["j", "sh", "plain", "-e", "A=1", "x"])
        .unwrap();
    jumpstarter_drivers::run_j_command(session.root(), matches)
        .await
        .unwrap();
    // A bad --env is refused before anything runs.
    let matches = jumpstarter_drivers::j_command(&session)
        .await
        .try_get_matches_from(["j", "sh", "plain", "-e", "NOEQUALS"])
        .unwrap();
    let e = jumpstarter_drivers::run_j_command(session.root(), matches)
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("Invalid --env value 'NOEQUALS'"),
        "{e}"
    );
}
