//! Board-farm drivers through the real binaries: `jmp shell` serving them, `j` driving them.

use crate::{J, JMP, Scratch, text};

/// `jmp shell` with `config` exported (YAML under `export:`), running `script` with `sh -c`
/// and our `j` first on `PATH`; returns the exit code, stdout and stderr.
fn in_shell(s: &Scratch, export: &str, script: &str) -> (Option<i32>, String, String) {
    s.write(
        "exporter.yaml",
        &format!(
            "apiVersion: jumpstarter.dev/v1alpha1\nkind: ExporterConfig\nmetadata:\n  \
             namespace: default\n  name: boards\nendpoint: \"\"\ntoken: \"\"\nexport:\n{export}"
        ),
    );
    let j_dir = std::path::Path::new(J).parent().unwrap();
    let path = format!(
        "{}:{}",
        j_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = s
        .cmd(JMP)
        .env("PATH", path)
        .args(["shell", "--exporter-config"])
        .arg(s.path("exporter.yaml"))
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    (out.status.code(), stdout, stderr)
}

const SHELL_EXPORT: &str = r#"  sh:
    type: jumpstarter_driver_shell.driver.Shell
    config:
      methods:
        greet:
          command: 'echo "hello $1"; echo "to stderr" >&2; exit "$2"'
          description: Greets someone
        args: 'printf "%s|" "$@"'
"#;

/// `j sh METHOD ARGS`: output as it comes, the method's exit code as j's, arguments
/// verbatim, every method listed with its description.
#[test]
fn shell_methods_run_through_j_with_their_exit_code() {
    let s = Scratch::new();
    let (code, stdout, stderr) = in_shell(
        &s,
        SHELL_EXPORT,
        "j sh greet world 7; echo \"code=$?\"; j sh greet again 0; echo \"code=$?\"; \
         j sh args -- '$(id)' 'a b' -x; echo; j sh --help",
    );
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("hello world\ncode=7\nhello again\ncode=0\n"),
        "{stdout}{stderr}"
    );
    assert!(stdout.contains("$(id)|a b|-x|\n"), "{stdout}");
    assert!(
        stdout.contains("greet") && stdout.contains("Greets someone"),
        "{stdout}"
    );
    assert!(stdout.contains("Execute the args shell method"), "{stdout}");
    assert_eq!(stderr.matches("to stderr").count(), 2, "{stderr}");
}

/// A bad shell config is refused naming the field, before anything is served.
#[test]
fn a_bad_shell_config_names_the_field() {
    let s = Scratch::new();
    let (code, stdout, stderr) = in_shell(
        &s,
        "  sh:\n    type: jumpstarter_driver_shell.driver.Shell\n    config:\n      methods:\n        a: {cmd: x}\n",
        "true",
    );
    assert_ne!(code, Some(0), "{stdout}{stderr}");
    assert!(stderr.contains("methods.a.cmd"), "{stderr}");
}
