//! The Helm chart, checked offline: lint and render for several value sets, validate the output
//! against Kubernetes schemas (1.29 and a current release, strict), assert the hardening, the
//! native sidecar, the config checksum, the schema's refusals, that every rendered config passes
//! `sluice check-config`, and that `sluice inject` adds exactly what the named templates add.
//!
//! helm and kubernetes-validate come from `scripts/tools` (`SLUICE_HELM`,
//! `SLUICE_KUBERNETES_VALIDATE`, set by `scripts/test`).

use std::path::PathBuf;
use std::process::Command;

use serde_norway::Value;

use crate::support::source_path;

/// The chart in this clone ([`source_path`]).
fn chart() -> String {
    source_path("helm/sluice").display().to_string()
}

/// Value sets every check runs over.
const VALUE_SETS: &[(&str, &[&str])] = &[
    ("defaults", &[]),
    ("regular sidecar", &["sidecar.native=false", "example.enabled=true"]),
    ("native sidecar example", &["example.enabled=true"]),
    (
        "monitoring",
        &[
            "monitoring.serviceMonitor.enabled=true",
            "monitoring.podMonitor.enabled=true",
            "monitoring.prometheusRule.enabled=true",
            "monitoring.grafanaDashboard.enabled=true",
        ],
    ),
    ("keda", &["persister.keda.enabled=true"]),
    (
        "topic template, keda",
        &[
            "kafka.topic=logs.{pod.labels.team}",
            "kafka.defaultTopic=logs.other",
            "persister.keda.enabled=true",
            "persister.config.persist.topics[0]=^logs\\..*",
            "sidecar.config.agent.pod_info.annotations[0]=sluice.dev/*",
            "sidecar.config.ingest.redact.rules[0].name=email",
            "sidecar.config.ingest.redact.rules[0].preset=email",
            "sidecar.config.ingest.redact.rules[1].name=password",
            "sidecar.config.ingest.redact.rules[1].field=password",
            "persister.config.persist.columns.user_id.pointer=/user/id",
            "persister.config.persist.columns.user_id.type=bigint",
            "persister.config.persist.columns.user_id.index=true",
        ],
    ),
    (
        "otlp, multiline",
        &[
            "sidecar.otlp.enabled=true",
            "sidecar.otlp.grpcPort=14317",
            "sidecar.config.ingest.listeners.default.multiline.preset=java",
        ],
    ),
    (
        "hpa, memory buffer, secrets",
        &[
            "persister.autoscaling.enabled=true",
            "sidecar.buffer=memory",
            "persister.postgresCaSecret=pg-ca",
            "kafka.secretProperties[0].property=sasl.password",
            "kafka.secretProperties[0].env=SLUICE_KAFKA_SASL_PASSWORD",
            "kafka.secretProperties[0].secretName=kafka",
            "kafka.secretProperties[0].secretKey=password",
            "kafka.properties.security\\.protocol=SASL_SSL",
            // The default mechanism, GSSAPI, is not built in: the producer check refuses it.
            "kafka.properties.sasl\\.mechanisms=SCRAM-SHA-512",
            "kafka.properties.sasl\\.username=sluice",
        ],
    ),
];

fn tool(variable: &str, fallback: &str) -> PathBuf {
    std::env::var_os(variable).map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
        home.join(".cache/sluice/tools").join(fallback)
    })
}

fn helm(args: &[&str]) -> std::process::Output {
    let helm = tool("SLUICE_HELM", "bin/helm");
    Command::new(&helm)
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("{} ({error}): run `scripts/tools helm` or set SLUICE_HELM", helm.display()))
}

fn render(sets: &[&str]) -> String {
    let chart = chart();
    let mut args = vec!["template", "t", chart.as_str(), "--kube-version", "1.29.0"];
    for set in sets {
        args.extend(["--set", set]);
    }
    let output = helm(&args);
    assert!(output.status.success(), "helm template {sets:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("utf-8")
}

fn documents(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).expect("rendered YAML parses"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

fn pod_spec(document: &Value) -> Option<&Value> {
    match document["kind"].as_str()? {
        "Deployment" | "StatefulSet" | "DaemonSet" | "Job" => document["spec"]["template"].get("spec"),
        _ => None,
    }
}

#[test]
fn the_chart_lints_and_renders_for_every_value_set() {
    for (name, sets) in VALUE_SETS {
        let chart = chart();
        let mut args = vec!["lint", chart.as_str(), "--strict", "--kube-version", "1.29.0"];
        for set in *sets {
            args.extend(["--set", set]);
        }
        let output = helm(&args);
        assert!(output.status.success(), "helm lint ({name}): {}", String::from_utf8_lossy(&output.stdout));
        assert!(!documents(&render(sets)).is_empty(), "{name}");
    }
}

#[test]
fn rendered_manifests_validate_against_kubernetes_1_29_and_a_current_release_strictly() {
    let validate = tool("SLUICE_KUBERNETES_VALIDATE", "python/bin/kubernetes-validate");
    let dir = tempfile::tempdir().expect("tempdir");
    for (index, (name, sets)) in VALUE_SETS.iter().enumerate() {
        let file = dir.path().join(format!("{index}.yaml"));
        std::fs::write(&file, render(sets)).expect("write");
        for version in ["1.29.0", "1.35.0"] {
            let output = Command::new(&validate)
                .args(["-k", version, "--strict", "--quiet"])
                .arg(&file)
                .output()
                .unwrap_or_else(|error| panic!("{} ({error}): run `scripts/tools python`", validate.display()));
            let report = String::from_utf8_lossy(&output.stdout).to_string() + &String::from_utf8_lossy(&output.stderr);
            // Prometheus Operator and KEDA kinds have no built-in schema: warned, not validated.
            let errors: Vec<&str> = report.lines().filter(|line| line.contains("ERROR")).collect();
            assert!(output.status.success() && errors.is_empty(), "{name} on Kubernetes {version}:\n{report}");
        }
    }
}

#[test]
fn every_container_is_hardened_and_has_resources() {
    for (name, sets) in VALUE_SETS {
        for document in documents(&render(sets)) {
            let Some(spec) = pod_spec(&document) else { continue };
            let containers = spec["containers"].as_sequence().into_iter().flatten();
            let init = spec.get("initContainers").and_then(Value::as_sequence).into_iter().flatten();
            for container in containers.chain(init) {
                let context = &container["securityContext"];
                let what = format!("{name}: container {:?}", container["name"]);
                assert_eq!(context["runAsNonRoot"], true, "{what}");
                assert_eq!(context["readOnlyRootFilesystem"], true, "{what}");
                assert_eq!(context["allowPrivilegeEscalation"], false, "{what}");
                assert_eq!(context["capabilities"]["drop"][0], "ALL", "{what}");
                assert_eq!(context["seccompProfile"]["type"], "RuntimeDefault", "{what}");
                assert!(container["resources"]["requests"].is_mapping(), "{what} has resource requests");
                assert!(container["resources"]["limits"]["memory"].is_string(), "{what} has a memory limit");
            }
        }
    }
}

fn example(sets: &[&str]) -> Value {
    let mut all = vec!["example.enabled=true"];
    all.extend_from_slice(sets);
    documents(&render(&all))
        .into_iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "t-sluice-example")
        .expect("the example Deployment")
}

#[test]
fn the_sidecar_is_native_by_default_and_a_regular_container_with_a_prestop_wait_otherwise() {
    let native = example(&[]);
    let spec = pod_spec(&native).expect("pod spec");
    let sidecar = &spec["initContainers"][0];
    assert_eq!((sidecar["name"].as_str(), sidecar["restartPolicy"].as_str()), (Some("sluice"), Some("Always")));
    assert_eq!(sidecar["startupProbe"]["httpGet"]["path"], "/healthz", "starts the app only once the socket listens");
    assert!(sidecar.get("lifecycle").is_none());

    let regular = example(&["sidecar.native=false"]);
    let spec = pod_spec(&regular).expect("pod spec");
    assert!(spec.get("initContainers").is_none());
    let sidecar =
        spec["containers"].as_sequence().expect("containers").iter().find(|c| c["name"] == "sluice").expect("sluice");
    assert_eq!(sidecar["lifecycle"]["preStop"]["exec"]["command"][1], "pre-stop");
    let volumes: Vec<&str> =
        spec["volumes"].as_sequence().expect("volumes").iter().filter_map(|v| v["name"].as_str()).collect();
    assert!(volumes.contains(&"sluice-spool"), "the spool on an emptyDir");
}

fn checksum(sets: &[&str]) -> String {
    documents(&render(sets))
        .into_iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "t-sluice-persister")
        .and_then(|d| d["spec"]["template"]["metadata"]["annotations"]["checksum/config"].as_str().map(str::to_owned))
        .expect("the persister carries a config checksum")
}

#[test]
fn the_persister_rolls_when_its_config_changes_and_only_then() {
    let base = checksum(&[]);
    assert_eq!(base, checksum(&[]));
    assert_eq!(base, checksum(&["sidecar.config.log.level=debug"]), "an agent setting does not roll the persisters");
    assert_ne!(base, checksum(&["persister.config.persist.batch_max_records=100"]));
}

#[test]
fn the_values_schema_rejects_wrong_types_unknown_keys_and_contradictions() {
    for (sets, expected) in [
        (vec!["persister.replicas=two"], "got string, want integer"),
        (vec!["sidecar.bogus=1"], "additional properties 'bogus' not allowed"),
        (vec!["sidecar.config.buffer.when_full=sometimes"], "when_full"),
        (vec!["sidecar.config.buffer.colour=red"], "colour"),
        (vec!["kafka.topic=has spaces"], "topic"),
        (vec!["kafka.topic=logs.{record.app}"], "defaultTopic"),
        (vec!["persister.keda.enabled=true", "persister.autoscaling.enabled=true"], "allOf"),
    ] {
        let chart = chart();
        let mut args = vec!["template", "t", chart.as_str(), "--kube-version", "1.29.0"];
        for set in &sets {
            args.extend(["--set", set]);
        }
        let output = helm(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success() && stderr.contains(expected), "{sets:?}: {stderr}");
    }
}

#[test]
fn every_rendered_config_passes_sluice_check_config() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, sets) in VALUE_SETS {
        for document in documents(&render(sets)) {
            if document["kind"] != "ConfigMap" {
                continue;
            }
            for (file, text) in document["data"].as_mapping().expect("data") {
                let file = file.as_str().expect("key");
                if !file.ends_with(".toml") {
                    continue;
                }
                let path = dir.path().join(file);
                std::fs::write(&path, text.as_str().expect("text")).expect("write");
                let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
                    .arg("check-config")
                    .arg(&path)
                    .env("SLUICE_KAFKA_SASL_PASSWORD", "from-the-secret")
                    .output()
                    .expect("sluice");
                assert!(
                    output.status.success(),
                    "{name}: {file} does not validate: {}\n{}",
                    String::from_utf8_lossy(&output.stderr),
                    text.as_str().unwrap_or_default()
                );
            }
        }
    }
}

/// The example Deployment as its author wrote it: the sidecar's additions taken out again.
fn without_sidecar(mut deployment: Value) -> Value {
    let template = &mut deployment["spec"]["template"];
    if let Some(labels) = template["metadata"]["labels"].as_mapping_mut() {
        labels.remove("sluice.dev/sidecar");
    }
    let spec = template["spec"].as_mapping_mut().expect("spec");
    spec.remove("initContainers");
    for (key, drop) in [("volumes", "sluice-"), ("containers", "sluice")] {
        if let Some(list) = spec.get_mut(key).and_then(Value::as_sequence_mut) {
            list.retain(|item| !item["name"].as_str().unwrap_or_default().starts_with(drop));
        }
    }
    spec.remove("volumes");
    for container in spec.get_mut("containers").and_then(Value::as_sequence_mut).expect("containers") {
        let container = container.as_mapping_mut().expect("container");
        container.remove("env");
        container.remove("volumeMounts");
    }
    deployment
}

#[test]
fn sluice_inject_adds_exactly_what_the_charts_named_templates_add() {
    for (sets, native) in [(vec![], true), (vec!["sidecar.native=false"], false), (vec!["sidecar.buffer=memory"], true)]
    {
        let rendered = example(&sets);
        let bare = without_sidecar(rendered.clone());
        let options = sluice::inject::Options {
            config_map: "t-sluice-agent".into(),
            native,
            buffer: if sets.contains(&"sidecar.buffer=memory") { "memory".into() } else { "disk".into() },
            ..sluice::inject::Options::default()
        };
        let injected =
            sluice::inject::inject(&serde_norway::to_string(&bare).expect("yaml"), &options).expect("inject");
        let injected: Value = serde_norway::from_str(&injected).expect("yaml");
        assert_eq!(
            injected,
            rendered,
            "{sets:?}\n--- inject:\n{}\n--- chart:\n{}",
            serde_norway::to_string(&injected).unwrap_or_default(),
            serde_norway::to_string(&rendered).unwrap_or_default()
        );
    }
}

#[test]
fn the_chart_readme_documents_every_value() {
    let values: Value = serde_norway::from_str(include_str!("../../helm/sluice/values.yaml")).expect("values.yaml");
    let readme = include_str!("../../helm/sluice/README.md");
    fn leaves(prefix: &str, value: &Value, out: &mut Vec<String>) {
        // Free-form maps (sluice's own config, resources, labels) are documented as a whole.
        let free = [
            "config",
            "resources",
            "selector",
            "labels",
            "properties",
            "podAnnotations",
            "nodeSelector",
            "affinity",
            "startup",
            "readiness",
            "liveness",
        ];
        match value.as_mapping() {
            Some(map) if !map.is_empty() && !free.iter().any(|f| prefix.ends_with(f)) => {
                for (key, child) in map {
                    let key = key.as_str().expect("string keys");
                    leaves(&if prefix.is_empty() { key.to_string() } else { format!("{prefix}.{key}") }, child, out);
                }
            }
            _ => out.push(prefix.to_string()),
        }
    }
    let mut keys = Vec::new();
    leaves("", &values, &mut keys);
    let missing: Vec<_> = keys.iter().filter(|key| !readme.contains(&format!("| `{key}` |"))).collect();
    assert!(missing.is_empty(), "helm/sluice/README.md lacks {missing:?}");
}
