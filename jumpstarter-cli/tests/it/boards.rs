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

/// Flashing the QEMU board from a URL through `jmp shell` and `j`: the exporter fetches
/// the image from a real HTTP server (our `HttpServer`, in the same exporter), the client
/// never opens it; the same files read through an `Opendal` driver with `scheme: http`.
#[test]
fn the_qemu_flasher_and_opendal_http_fetch_from_a_url_through_j() {
    let s = Scratch::new();
    let www = s.path("www");
    std::fs::create_dir_all(www.join("images")).unwrap();
    let image: Vec<u8> = (0..700_000u32).flat_map(|i| i.to_le_bytes()).collect();
    std::fs::write(www.join("images/disk a+1.img"), &image).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let export = format!(
        "  board:\n    type: jumpstarter_driver_qemu.driver.Qemu\n    config:\n      mem: 256M\n\
         \x20 http:\n    type: jumpstarter_driver_http.driver.HttpServer\n    config:\n      \
         root_dir: {www}\n      host: 127.0.0.1\n      port: {port}\n\
         \x20 web:\n    type: jumpstarter_driver_opendal.driver.Opendal\n    config:\n      \
         scheme: http\n      kwargs:\n        endpoint: http://127.0.0.1:{port}\n        \
         root: /images\n",
        www = www.display()
    );
    let (code, stdout, stderr) = in_shell(
        &s,
        &export,
        "set -e; j http start; url=$(j http get-url); \
         j board flasher flash \"$url/images/disk%20a%2B1.img\"; \
         j board flasher dump back.img; \
         if j board flasher flash \"$url/images/missing.img\"; then echo missing-flashed; fi; \
         if j board flasher dump \"$url/up.img\"; then echo dumped-to-url; fi; \
         j web read-into-path 'disk a+1.img' web.img; j web stat 'disk a+1.img'; \
         if j web write-bytes new.txt </dev/null; then echo wrote; fi; \
         echo done",
    );
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.ends_with("done\n"), "{stdout}{stderr}");
    assert!(
        std::fs::read(s.path("back.img")).unwrap() == image,
        "the flashed image differs"
    );
    assert!(
        std::fs::read(s.path("web.img")).unwrap() == image,
        "the image read through scheme http differs"
    );
    assert!(stdout.contains("\"content_length\": 2800000"), "{stdout}");
    for bad in ["missing-flashed", "dumped-to-url", "wrote"] {
        assert!(!stdout.contains(bad), "{bad}: {stdout}{stderr}");
    }
    assert!(stderr.contains("404"), "{stderr}");
    assert!(stderr.contains("cannot dump to a URL"), "{stderr}");
    assert!(stderr.contains("not supported"), "{stderr}");
    // The exporter's log of the fetch reaches the client.
    assert!(stderr.contains("flashed 2800000 bytes to root"), "{stderr}");
}
