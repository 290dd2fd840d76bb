//! Keys of exporter and client configs that nothing reads: each is a warning naming it (a
//! misspelt `onFailure` must not silently become the default), never an error (configs
//! written by newer upstream versions keep working).

/// A config section: its known keys, and the known keys of its sub-sections.
struct Schema {
    keys: &'static [&'static str],
    sections: &'static [(&'static str, &'static Schema)],
}

const META: Schema = Schema {
    keys: &["namespace", "name"],
    sections: &[],
};
const TLS: Schema = Schema {
    keys: &["ca", "insecure"],
    sections: &[],
};
const HOOK: Schema = Schema {
    keys: &["exec", "script", "timeout", "onFailure"],
    sections: &[],
};
const HOOKS: Schema = Schema {
    keys: &["beforeLease", "afterLease"],
    sections: &[("beforeLease", &HOOK), ("afterLease", &HOOK)],
};
const FAILURE_DETECTION: Schema = Schema {
    keys: &["maxRapidFailures", "rapidFailureWindow"],
    sections: &[],
};
const HEALTH_CHECK: Schema = Schema {
    keys: &["exec", "script", "interval", "timeout", "threshold"],
    sections: &[],
};
const EXPORTER: Schema = Schema {
    keys: &[
        "apiVersion",
        "kind",
        "metadata",
        "endpoint",
        "tls",
        "token",
        "grpcOptions",
        "description",
        "export",
        "hooks",
        "failureDetection",
        "healthCheck",
        "directListener",
        "directAdvertise",
        "exitOnLeaseEnd",
        "motd",
        "consoleTranscripts",
    ],
    sections: &[
        ("metadata", &META),
        ("tls", &TLS),
        ("hooks", &HOOKS),
        ("failureDetection", &FAILURE_DETECTION),
        ("healthCheck", &HEALTH_CHECK),
    ],
};
const DRIVERS: Schema = Schema {
    keys: &["allow", "unsafe"],
    sections: &[],
};
const SHELL: Schema = Schema {
    keys: &["use_profiles"],
    sections: &[],
};
const LEASES: Schema = Schema {
    keys: &["acquisition_timeout", "retry_timeout"],
    sections: &[],
};
const CLIENT: Schema = Schema {
    keys: &[
        "apiVersion",
        "kind",
        "metadata",
        "endpoint",
        "tls",
        "token",
        "refresh_token",
        "grpcOptions",
        "drivers",
        "shell",
        "leases",
    ],
    sections: &[
        ("metadata", &META),
        ("tls", &TLS),
        ("drivers", &DRIVERS),
        ("shell", &SHELL),
        ("leases", &LEASES),
    ],
};

fn walk(value: &serde_json::Value, schema: &Schema, prefix: &str, out: &mut Vec<String>) {
    let Some(map) = value.as_object() else {
        return;
    };
    for (key, v) in map {
        let path = format!("{prefix}{key}");
        if !schema.keys.contains(&key.as_str()) {
            out.push(path);
            continue;
        }
        if let Some((_, sub)) = schema.sections.iter().find(|(k, _)| k == key) {
            walk(v, sub, &format!("{path}."), out);
        }
    }
}

fn unknown(text: &str, schema: &Schema) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(value) = serde_saphyr::from_str::<serde_json::Value>(text) {
        walk(&value, schema, "", &mut out);
    }
    out.sort();
    out
}

/// The keys of exporter config `text` that nothing reads (dotted paths).
pub fn unknown_exporter_keys(text: &str) -> Vec<String> {
    unknown(text, &EXPORTER)
}

/// The keys of client config `text` that nothing reads (dotted paths).
pub fn unknown_client_keys(text: &str) -> Vec<String> {
    unknown(text, &CLIENT)
}

/// Logs a warning per unknown key of a config file.
pub fn warn_unknown(path: &std::path::Path, keys: &[String]) {
    for key in keys {
        tracing::warn!("{}: unknown key `{key}` is ignored", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_named_with_their_path() {
        let text = "apiVersion: jumpstarter.dev/v1alpha1\nkind: ExporterConfig\nmetadata:\n  name: e\n  \
                    colour: red\nexport: {}\nhooks:\n  beforeLease:\n    script: true\n    \
                    on_failure: exit\n  duringLease: {}\nfrobnicate: 1\n";
        assert_eq!(
            unknown_exporter_keys(text),
            [
                "frobnicate",
                "hooks.beforeLease.on_failure",
                "hooks.duringLease",
                "metadata.colour"
            ]
        );
        let text = "apiVersion: jumpstarter.dev/v1alpha1\nkind: ClientConfig\nleases:\n  \
                    acquisition_timeout: 5\n  retries: 3\ngrpcOptions: {}\n";
        assert_eq!(unknown_client_keys(text), ["leases.retries"]);
    }
}
