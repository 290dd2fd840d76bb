//! Prints the controller's CRDs as YAML (`--out DIR`: writes `<group>_<plural>.yaml` files
//! there instead; `--check DIR`: compares with the CRD files in DIR and fails on differences
//! other than the allowed ones). Run through `cargo xtask crds`.

use std::path::PathBuf;
use std::process::ExitCode;

use jumpstarter_controller::crd;

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crds: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Vec<String>) -> Result<(), String> {
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] => {
            for c in crd::crds().map_err(|e| e.to_string())? {
                print!("{}", crd::to_yaml(&c).map_err(|e| e.to_string())?);
            }
            Ok(())
        }
        ["--out", dir] => {
            for path in crd::write_all(&PathBuf::from(dir)).map_err(|e| e.to_string())? {
                println!("wrote {}", path.display());
            }
            Ok(())
        }
        ["--check", dir] => check(&PathBuf::from(dir)),
        _ => Err(format!(
            "usage: crds [--out DIR | --check DIR] (got {})",
            args.join(" ")
        )),
    }
}

fn check(dir: &std::path::Path) -> Result<(), String> {
    let mut problems = Vec::new();
    for c in crd::crds().map_err(|e| e.to_string())? {
        let path = dir.join(crd::file_name(&c));
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let theirs: serde_json::Value =
            serde_saphyr::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let ours = serde_json::to_value(&c).map_err(|e| e.to_string())?;
        for d in crd::structural_differences(&ours, &theirs) {
            problems.push(format!("{}: {d}", path.display()));
        }
    }
    if problems.is_empty() {
        println!("our CRDs match {} (allowed differences:", dir.display());
        for a in crd::ALLOWED_DIFFERENCES {
            println!("  {}: {}", a.path, a.reason);
        }
        println!(")");
        Ok(())
    } else {
        Err(format!(
            "{} differences:\n{}",
            problems.len(),
            problems.join("\n")
        ))
    }
}
