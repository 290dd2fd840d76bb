//! Local mode: `jmp shell --exporter-config`, `j`, config errors.

use crate::{J, JMP, Scratch, text};

#[test]
fn shell_runs_j_against_an_in_process_exporter() {
    let s = Scratch::new();
    let out = s
        .cmd(JMP)
        .args([
            "shell",
            "--exporter-config",
            "exporter.yaml",
            "--",
            J,
            "power",
            "on",
        ])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stderr.contains("[driver.MockPower] power on"), "{stderr}");

    let out = s
        .cmd(JMP)
        .args([
            "shell",
            "--exporter-config",
            "exporter.yaml",
            "--",
            J,
            "power",
            "read",
        ])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert_eq!(
        stdout,
        "voltage=0.0 V  current=0.0 A  apparent_power=0.0 VA\n\
         voltage=5.0 V  current=2.0 A  apparent_power=10.0 VA\n"
    );
}

#[test]
fn shell_propagates_the_exit_code_and_sets_the_environment() {
    let s = Scratch::new();
    let out = s
        .cmd(JMP)
        .args([
            "shell",
            "--exporter-config",
            "exporter.yaml",
            "--",
            "sh",
            "-c",
        ])
        .arg("echo \"$JUMPSTARTER_HOST|$JMP_DRIVERS_ALLOW\"; exit 7")
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(7), "{stdout}{stderr}");
    let (host, allow) = stdout.trim().split_once('|').unwrap();
    assert!(host.ends_with("exporter@socket"), "{host}");
    assert_eq!(allow, "UNSAFE");
    // The private socket directory is gone afterwards.
    assert!(!std::path::Path::new(host).exists());
}

#[test]
fn j_outside_a_shell_says_why() {
    let s = Scratch::new();
    let out = s.cmd(J).args(["power", "on"]).output().unwrap();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr.trim(),
        "Error: the j command must be used inside a jmp shell: JUMPSTARTER_HOST not set"
    );
}

#[test]
fn j_usage_errors_exit_2_and_help_lists_drivers() {
    let s = Scratch::new();
    let out = s
        .cmd(JMP)
        .args([
            "shell",
            "--exporter-config",
            "exporter.yaml",
            "--",
            J,
            "power",
            "explode",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = s
        .cmd(JMP)
        .args([
            "shell",
            "--exporter-config",
            "exporter.yaml",
            "--",
            J,
            "--help",
        ])
        .output()
        .unwrap();
    let (stdout, _) = text(&out);
    assert!(out.status.success());
    assert!(
        stdout.contains("power") && stdout.contains("Generic power"),
        "{stdout}"
    );
}

#[test]
fn bad_configs_give_one_clear_error() {
    let s = Scratch::new();
    let cases = [
        (
            "malformed.yaml",
            "export:\n  power: [\n",
            vec!["malformed.yaml"],
        ),
        (
            "unknown.yaml",
            "apiVersion: jumpstarter.dev/v1alpha1\nkind: ExporterConfig\nexport:\n  power:\n    type: acme.driver.Toaster\n",
            vec!["unknown.yaml:5", "export.power.type", "acme.driver.Toaster"],
        ),
        (
            "typo.yaml",
            "kind: ExporterConfig\nexport:\n  power:\n    typo: x\n",
            vec!["typo.yaml", "typo"],
        ),
        (
            "badconfig.yaml",
            "kind: ExporterConfig\nexport:\n  power:\n    type: jumpstarter_driver_power.driver.MockPower\n    config:\n      volts: 3\n",
            vec!["badconfig.yaml", "export.power.config", "volts"],
        ),
    ];
    for (name, body, needles) in cases {
        s.write(name, body);
        let out = s
            .cmd(JMP)
            .args(["shell", "--exporter-config", name, "--", "true"])
            .output()
            .unwrap();
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        assert!(stderr.starts_with("Error: "), "{name}: {stderr}");
        for n in needles {
            assert!(stderr.contains(n), "{name}: {n:?} not in {stderr}");
        }
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let out = s
        .cmd(JMP)
        .args(["shell", "--exporter-config", "missing.yaml", "--", "true"])
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("missing.yaml"), "{stderr}");
}

#[test]
fn exporter_alias_is_found_in_the_config_dir() {
    let s = Scratch::new();
    std::fs::create_dir_all(s.path("config/exporters")).unwrap();
    std::fs::copy(
        s.path("exporter.yaml"),
        s.path("config/exporters/bench.yaml"),
    )
    .unwrap();
    let out = s
        .cmd(JMP)
        .args(["shell", "--exporter", "bench", "--", J, "power", "off"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
    let out = s
        .cmd(JMP)
        .args(["shell", "--exporter", "nope", "--", "true"])
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("nope"), "{stderr}");
}

#[test]
fn exporter_logs_are_printed_only_when_asked() {
    let s = Scratch::new();
    // The follower subscribes after the command starts: call a few times, spaced out.
    let script = format!("for i in 1 2 3 4 5 6; do sleep 0.5; {J} power on >/dev/null; done");
    let run = |extra: &[&str]| {
        let out = s
            .cmd(JMP)
            .args(["shell", "--exporter-config", "exporter.yaml"])
            .args(extra)
            .args(["--", "sh", "-c", &script])
            .output()
            .unwrap();
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{stdout}{stderr}");
        stderr
    };
    let with = run(&["--exporter-logs"]);
    assert!(with.contains("[driver] INFO power on"), "{with}");
    let without = run(&[]);
    assert!(!without.contains("[driver] INFO"), "{without}");
}

#[test]
fn completion_scripts_for_each_shell() {
    let s = Scratch::new();
    for (shell, marker) in [
        ("bash", "-F _clap_complete_jmp jmp"),
        ("zsh", "#compdef jmp"),
        ("fish", "complete --keep-order --exclusive --command jmp"),
    ] {
        let out = s.cmd(JMP).args(["completion", shell]).output().unwrap();
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{shell}: {stderr}");
        assert!(stdout.contains(marker), "{shell}: {stdout}");
        // The script asks this jmp for the words (names included, see first_hour.rs).
        assert!(stdout.contains("JMP_COMPLETE"), "{shell}: {stdout}");
        assert!(stdout.contains(JMP), "{shell}: {stdout}");
        // Subcommands deep in the tree are offered, in each shell's format.
        let out = s
            .cmd(JMP)
            .env("JMP_COMPLETE", shell)
            .env("_CLAP_COMPLETE_INDEX", "2")
            .args(["--", "jmp", "get", "ex"])
            .output()
            .unwrap();
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{shell}: {stderr}");
        assert!(stdout.starts_with("exporters"), "{shell}: {stdout}");
    }
    let out = s
        .cmd(JMP)
        .args(["completion", "powershell"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).1.contains("bash, zsh, fish"), "{:?}", text(&out));
}

#[test]
fn files_created_in_a_shell_are_removed_when_it_ends_if_configured() {
    let s = Scratch::new();
    let root = s.path("root");
    std::fs::create_dir(&root).unwrap();
    s.write("image.img", "image bytes");
    let config = |remove: bool| {
        format!(
            "apiVersion: jumpstarter.dev/v1alpha1\nkind: ExporterConfig\nmetadata:\n  \
             namespace: default\n  name: e2e\nendpoint: \"\"\ntoken: \"\"\nexport:\n  \
             storage:\n    type: jumpstarter_driver_opendal.driver.Opendal\n    config:\n      \
             scheme: fs\n      kwargs:\n        root: {}\n      remove_created_on_close: {remove}\n",
            root.display()
        )
    };
    for remove in [true, false] {
        s.write("opendal.yaml", &config(remove));
        let out = s
            .cmd(JMP)
            .args([
                "shell",
                "--exporter-config",
                "opendal.yaml",
                "--",
                "sh",
                "-c",
            ])
            .arg(format!(
                "{J} storage write-from-path copy.img image.img && test -f root/copy.img"
            ))
            .output()
            .unwrap();
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{stdout}{stderr}");
        // As upstream, where drivers are closed at the end of each session.
        assert_eq!(root.join("copy.img").exists(), !remove, "remove={remove}");
    }
}
