//! The Helm chart, checked offline: lint and render for several value sets, validate the output
//! against Kubernetes schemas (1.29 and a current release, strict), assert the hardening, the
//! native sidecar, the config checksum, the schema's refusals, that every rendered config passes
//! `sluice check-config`, that `sluice inject` adds exactly what the named templates add, and that
//! an app's chart with sluice as a dependency (helm/examples/app) renders and validates.
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
    ("monitoring for kube-prometheus-stack", KUBE_PROMETHEUS_STACK),
    ("keda", &["persister.keda.enabled=true"]),
    (
        "keda with SASL, persister extras",
        &[
            "persister.keda.enabled=true",
            "persister.keda.authentication.sasl=scram_sha512",
            "persister.keda.authentication.tls=enable",
            "persister.keda.authentication.secretTargetRef[0].parameter=username",
            "persister.keda.authentication.secretTargetRef[0].name=kafka-credentials",
            "persister.keda.authentication.secretTargetRef[0].key=username",
            "persister.keda.authentication.secretTargetRef[1].parameter=password",
            "persister.keda.authentication.secretTargetRef[1].name=kafka-credentials",
            "persister.keda.authentication.secretTargetRef[1].key=password",
            "persister.serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::1:role/sluice",
            "persister.podLabels.team=logging",
            "persister.priorityClassName=high",
            "persister.topologySpreadConstraints[0].maxSkew=1",
            "persister.topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
            "persister.topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
            "persister.topologySpreadConstraints[0].labelSelector.matchLabels.app\\.kubernetes\\.io/component=persister",
            "persister.extraEnv[0].name=TZ",
            "persister.extraEnv[0].value=UTC",
            "persister.extraVolumes[0].name=tmp",
            "persister.extraVolumes[0].emptyDir.medium=Memory",
            "persister.extraVolumeMounts[0].name=tmp",
            "persister.extraVolumeMounts[0].mountPath=/tmp",
            "persister.probes.startup.httpGet.path=/healthz",
            "persister.probes.startup.httpGet.port=admin",
            "persister.probes.startup.failureThreshold=30",
        ],
    ),
    (
        "sidecar extras, no fsGroup, OpenShift-like",
        &[
            "example.enabled=true",
            "sidecar.fsGroup=null",
            "sidecar.adminPort=9470",
            "sidecar.extraEnv[0].name=TZ",
            "sidecar.extraEnv[0].value=UTC",
            "sidecar.extraVolumes[0].name=kafka-ca",
            "sidecar.extraVolumes[0].secret.secretName=kafka-ca",
            "sidecar.extraVolumeMounts[0].name=kafka-ca",
            "sidecar.extraVolumeMounts[0].mountPath=/etc/sluice/kafka-ca",
            "sidecar.extraVolumeMounts[0].readOnly=true",
            "persister.serviceAccount.create=false",
        ],
    ),
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
        "two persisters, keda",
        &[
            "persister.keda.enabled=true",
            "persisters[0].name=team-a",
            "persisters[0].postgresUrlSecret.name=sluice-postgres-team-a",
            "persisters[0].config.persist.group_id=sluice-team-a",
            // --set takes a backslash as an escape: a class instead of `\.`.
            "persisters[0].config.persist.topics[0]=^logs[.]team-a$",
            "persisters[1].name=team-b",
            "persisters[1].postgresUrlSecret.name=sluice-postgres-team-b",
            "persisters[1].config.persist.group_id=sluice-team-b",
            "persisters[1].config.persist.topics[0]=logs.team-b",
            "persisters[1].keda.enabled=false",
            "persisters[1].autoscaling.enabled=true",
            "persisters[1].podDisruptionBudget.enabled=false",
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

/// Monitoring as a kube-prometheus-stack user sets it: its `release` label, a team's label on one
/// object, relabelings of one's own, a metric dropped, namespaces narrowed.
const KUBE_PROMETHEUS_STACK: &[&str] = &[
    "monitoring.serviceMonitor.enabled=true",
    "monitoring.podMonitor.enabled=true",
    "monitoring.prometheusRule.enabled=true",
    "monitoring.additionalLabels.release=kps",
    "monitoring.podMonitor.additionalLabels.release=kps-agents",
    "monitoring.prometheusRule.additionalLabels.team=platform",
    "monitoring.podMonitor.relabelings[0].targetLabel=cluster",
    "monitoring.podMonitor.relabelings[0].replacement=eu-1",
    "monitoring.podMonitor.namespaceSelector.matchNames[0]=shop",
    "monitoring.podMonitor.namespaceSelector.any=false",
    "monitoring.serviceMonitor.metricRelabelings[0].action=drop",
    "monitoring.serviceMonitor.metricRelabelings[0].sourceLabels[0]=__name__",
    "monitoring.serviceMonitor.metricRelabelings[0].regex=sluice_kafka_.*",
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

/// `helm template` of the chart with a values file holding `values` (none if empty) and `sets`.
fn template(values: &str, sets: &[&str]) -> std::process::Output {
    let chart = chart();
    let file = tempfile::NamedTempFile::new().expect("values file");
    std::fs::write(file.path(), values).expect("write values");
    let file = file.path().display().to_string();
    let mut args = vec!["template", "t", chart.as_str(), "--kube-version", "1.29.0"];
    if !values.is_empty() {
        args.extend(["--values", file.as_str()]);
    }
    for set in sets {
        args.extend(["--set", set]);
    }
    helm(&args)
}

fn render(sets: &[&str]) -> String {
    render_values("", sets)
}

/// The manifests `template` renders; a failure to render fails the test.
fn render_values(values: &str, sets: &[&str]) -> String {
    let output = template(values, sets);
    assert!(output.status.success(), "helm template {sets:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("utf-8")
}

/// Validates the manifests in `file` with kubernetes-validate against Kubernetes 1.29 and a
/// current release, strictly; `what` names them in a failure.
fn assert_validates_strictly(file: &std::path::Path, what: &str) {
    let validate = tool("SLUICE_KUBERNETES_VALIDATE", "python/bin/kubernetes-validate");
    for version in ["1.29.0", "1.35.0"] {
        let output = Command::new(&validate)
            .args(["-k", version, "--strict", "--quiet"])
            .arg(file)
            .output()
            .unwrap_or_else(|error| panic!("{} ({error}): run `scripts/tools python`", validate.display()));
        let report = String::from_utf8_lossy(&output.stdout).to_string() + &String::from_utf8_lossy(&output.stderr);
        // Prometheus Operator and KEDA kinds have no built-in schema: warned, not validated.
        let errors = report.lines().filter(|line| line.contains("ERROR")).count();
        assert!(output.status.success() && errors == 0, "{what} on Kubernetes {version}:\n{report}");
    }
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
    let dir = tempfile::tempdir().expect("tempdir");
    for (index, (name, sets)) in VALUE_SETS.iter().enumerate() {
        let file = dir.path().join(format!("{index}.yaml"));
        std::fs::write(&file, render(sets)).expect("write");
        assert_validates_strictly(&file, name);
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
        (vec!["persister.keda.authentication.sasl=scram"], "sasl"),
        (vec!["persister.keda.authentication.secretTargetRef[0].parameter=username"], "secretTargetRef"),
        (vec!["sidecar.fsGroup=-1"], "fsGroup"),
        (vec!["enabled=yes"], "enabled"),
        (vec!["persister.serviceAccount.automount=true"], "automount"),
        (vec!["monitoring.podMonitor.relabelings[0].action=rename"], "action"),
        (vec!["monitoring.additionalLabels.release=1"], "release"),
        (vec!["persisters[0].name=Team_A"], "/persisters/0/name"),
        (vec!["persisters[0].name=a", "persisters[0].replica=3"], "additional properties 'replica' not allowed"),
        (vec!["persisters[0].replicas=3"], "missing property 'name'"),
    ] {
        let output = template("", &sets);
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
    spec.remove("terminationGracePeriodSeconds");
    if let Some(context) = spec.get_mut("securityContext").and_then(Value::as_mapping_mut) {
        context.remove("fsGroup");
    }
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
    let default = sluice::inject::Options { config_map: "t-sluice-agent".into(), ..sluice::inject::Options::default() };
    let cases: Vec<(Vec<&str>, sluice::inject::Options)> = vec![
        (vec![], default.clone()),
        (vec!["sidecar.native=false"], sluice::inject::Options { native: false, ..default.clone() }),
        (vec!["sidecar.buffer=memory"], sluice::inject::Options { buffer: "memory".into(), ..default.clone() }),
        // The admin port, the grace period's parts, a pod left without fsGroup: flag for value.
        (
            vec![
                "sidecar.adminPort=9470",
                "sidecar.appShutdownSeconds=20",
                "sidecar.config.agent.drain_timeout=1m",
                "sidecar.fsGroup=null",
            ],
            sluice::inject::Options {
                admin_port: 9470,
                app_shutdown: std::time::Duration::from_secs(20),
                drain_timeout: std::time::Duration::from_secs(60),
                fs_group: None,
                ..default.clone()
            },
        ),
        (
            vec!["sidecar.native=false", "sidecar.preStopWait=30s", "sidecar.config.agent.drain_timeout=1500ms"],
            sluice::inject::Options {
                native: false,
                pre_stop_wait: "30s".into(),
                drain_timeout: std::time::Duration::from_millis(1500),
                ..default.clone()
            },
        ),
    ];
    for (sets, options) in cases {
        let rendered = example(&sets);
        let bare = without_sidecar(rendered.clone());
        let injected =
            sluice::inject::inject(&serde_norway::to_string(&bare).expect("yaml"), &options).expect("inject");
        let injected: Value = serde_norway::from_str(&injected.manifest).expect("yaml");
        assert_eq!(
            injected,
            rendered,
            "{sets:?}\n--- inject:\n{}\n--- chart:\n{}",
            serde_norway::to_string(&injected).unwrap_or_default(),
            serde_norway::to_string(&rendered).unwrap_or_default()
        );
    }
}

fn sluice_command(args: &[&str], stdin: &str) -> std::process::Output {
    use std::io::Write as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("sluice");
    child.stdin.take().expect("stdin").write_all(stdin.as_bytes()).expect("write stdin");
    child.wait_with_output().expect("sluice")
}

const SHOP: &str = "apiVersion: apps/v1
kind: Deployment
metadata: {name: shop}
spec:
  selector: {matchLabels: {app: shop}}
  template:
    metadata: {labels: {app: shop}}
    spec:
      containers:
        - name: shop
          image: shop:1
          securityContext: {runAsUser: 1000, runAsGroup: 1000}
";

#[test]
fn sluice_inject_says_on_stderr_what_it_set_for_the_pod_and_takes_the_admin_port() {
    let output = sluice_command(&["inject", "--admin-port", "9470", "--app-shutdown", "20s"], SHOP);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let pod: Value = serde_norway::from_slice(&output.stdout).expect("yaml");
    let spec = &pod["spec"]["template"]["spec"];
    assert_eq!(spec["securityContext"]["fsGroup"], 65532);
    assert_eq!(spec["terminationGracePeriodSeconds"], 50, "20 s + the chart's 25 s drain + 5 s");
    assert_eq!(spec["initContainers"][0]["ports"][0]["containerPort"], 9470);
    assert!(
        stderr.contains("sluice inject: document 1 (Deployment shop): set securityContext.fsGroup 65532"),
        "{stderr}"
    );
    assert!(stderr.contains("set terminationGracePeriodSeconds 50 (was unset, 30 s)"), "{stderr}");

    let output = sluice_command(&["inject", "--fs-group", "none"], SHOP);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("WARNING: no fsGroup (--fs-group none) and containers shop"), "{stderr}");

    let output = sluice_command(&["inject", "--fs-group", "staff"], SHOP);
    assert_eq!(output.status.code(), Some(2), "a bad flag is a usage error");
    let help = sluice_command(&["inject", "--help"], "");
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in ["--admin-port", "--fs-group", "--drain-timeout", "--app-shutdown", "terminationGracePeriodSeconds"] {
        assert!(help.contains(flag), "inject --help mentions {flag}:\n{help}");
    }
}

#[test]
fn keda_reaches_a_sasl_broker_through_a_trigger_authentication() {
    let (_, sets) = VALUE_SETS.iter().find(|(name, _)| name.starts_with("keda with SASL")).expect("value set");
    let rendered = documents(&render(sets));
    let auth = rendered.iter().find(|d| d["kind"] == "TriggerAuthentication").expect("a TriggerAuthentication");
    assert_eq!(auth["metadata"]["name"], "t-sluice-persister");
    assert_eq!(auth["spec"]["secretTargetRef"][1]["parameter"], "password");
    assert_eq!(auth["spec"]["secretTargetRef"][1]["name"], "kafka-credentials");
    let scaled = rendered.iter().find(|d| d["kind"] == "ScaledObject").expect("a ScaledObject");
    let trigger = &scaled["spec"]["triggers"][0];
    assert_eq!(trigger["authenticationRef"]["name"], "t-sluice-persister");
    assert_eq!(
        (trigger["metadata"]["sasl"].as_str(), trigger["metadata"]["tls"].as_str()),
        (Some("scram_sha512"), Some("enable"))
    );

    let existing = documents(&render(&[
        "persister.keda.enabled=true",
        "persister.keda.authentication.existingName=kafka-auth",
        "persister.keda.authentication.kind=ClusterTriggerAuthentication",
    ]));
    assert!(!existing.iter().any(|d| d["kind"] == "TriggerAuthentication"), "an existing one is only referenced");
    let trigger = &existing.iter().find(|d| d["kind"] == "ScaledObject").expect("ScaledObject")["spec"]["triggers"][0];
    assert_eq!(trigger["authenticationRef"]["name"], "kafka-auth");
    assert_eq!(trigger["authenticationRef"]["kind"], "ClusterTriggerAuthentication");
    let plain = documents(&render(&["persister.keda.enabled=true"]));
    let trigger = &plain.iter().find(|d| d["kind"] == "ScaledObject").expect("ScaledObject")["spec"]["triggers"][0];
    assert!(trigger.get("authenticationRef").is_none(), "a plaintext broker needs none");
}

/// From the cold review of issue 34: without a topic, KEDA sums lag only over the topics the
/// group has committed on, so a new topic (a cut-over's) shows none; with `minReplicas: 0` no
/// replica would ever start to read it. A new group's lag counts from the earliest offset, as the
/// persister reads.
#[test]
fn keda_counts_lag_from_the_earliest_offset_and_refuses_scaling_to_zero_on_a_pattern() {
    let rendered = documents(&render(&["persister.keda.enabled=true"]));
    let trigger = &rendered.iter().find(|d| d["kind"] == "ScaledObject").expect("ScaledObject")["spec"]["triggers"][0];
    assert_eq!(trigger["metadata"]["offsetResetPolicy"], "earliest");
    let stderr = refusal(
        "persister:
  keda: {enabled: true, minReplicas: 0}
  config: {persist: {topics: ['^logs[.].*']}}
",
    );
    assert!(stderr.contains("keda.minReplicas 0 needs a single literal topic"), "{stderr}");
    let literal = documents(&render_values(
        "persister:
  keda: {enabled: true, minReplicas: 0}
  config: {persist: {topics: [logs.team-a]}}
",
        &[],
    ));
    let scaled = literal.iter().find(|d| d["kind"] == "ScaledObject").expect("ScaledObject");
    assert_eq!(scaled["spec"]["triggers"][0]["metadata"]["topic"], "logs.team-a");
    assert_eq!(scaled["spec"]["minReplicaCount"], 0);
}

#[test]
fn the_persister_takes_the_usual_values_and_pins_no_uid() {
    let (_, sets) = VALUE_SETS.iter().find(|(name, _)| name.starts_with("keda with SASL")).expect("value set");
    let rendered = documents(&render(sets));
    let deployment = rendered
        .iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "t-sluice-persister")
        .expect("the persister");
    let template = &deployment["spec"]["template"];
    let spec = &template["spec"];
    assert_eq!(template["metadata"]["labels"]["team"], "logging");
    assert_eq!(spec["serviceAccountName"], "t-sluice-persister");
    assert_eq!(spec["automountServiceAccountToken"], false);
    assert_eq!(spec["priorityClassName"], "high");
    assert_eq!(spec["topologySpreadConstraints"][0]["topologyKey"], "topology.kubernetes.io/zone");
    let container = &spec["containers"][0];
    assert!(container["env"].as_sequence().expect("env").iter().any(|e| e["name"] == "TZ"));
    assert!(container["volumeMounts"].as_sequence().expect("mounts").iter().any(|m| m["mountPath"] == "/tmp"));
    assert_eq!(container["startupProbe"]["failureThreshold"], 30);
    let account = rendered.iter().find(|d| d["kind"] == "ServiceAccount").expect("its ServiceAccount");
    assert_eq!(account["automountServiceAccountToken"], false);
    assert_eq!(account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"], "arn:aws:iam::1:role/sluice");

    // OpenShift's restricted SCC assigns uids, gids and fsGroups: none is pinned anywhere.
    for (name, sets) in VALUE_SETS {
        let text = render(sets);
        for key in ["runAsUser", "runAsGroup"] {
            assert!(!text.contains(key), "{name}: the chart pins {key}");
        }
    }
    let openshift = render(&["example.enabled=true", "sidecar.fsGroup=null"]);
    assert!(!openshift.contains("fsGroup"), "sidecar.fsGroup=null leaves the pod's fsGroup to the platform");
}

/// The values of helm/sluice/README.md's "Several PostgreSQL clusters": team-a and team-b, KEDA on.
fn several_clusters_example() -> &'static str {
    let readme = include_str!("../../helm/sluice/README.md");
    let (_, section) = readme.split_once("## Several PostgreSQL clusters").expect("the README's section");
    let (_, block) = section.split_once("```yaml\n").expect("its values");
    block.split_once("```").expect("the block's end").0
}

/// The rendered object of `kind` named `name`.
fn object<'a>(documents: &'a [Value], kind: &str, name: &str) -> &'a Value {
    documents
        .iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("a {kind} {name}"))
}

/// Whether a `matchLabels` selector selects pods labelled `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let labels = labels.as_mapping().expect("labels");
    selector.as_mapping().expect("matchLabels").iter().all(|(key, value)| labels.get(key) == Some(value))
}

#[test]
fn two_persisters_render_each_with_its_group_topics_url_and_keda_scaler() {
    let text = render_values(several_clusters_example(), &[]);
    let rendered = documents(&text);
    let pods = |name: &str| object(&rendered, "Deployment", name)["spec"]["template"]["metadata"]["labels"].clone();
    let cases = [
        ("team-a", "sluice-team-a", vec!["^logs\\.team-a$", "logs.other"], None, 6),
        ("team-b", "sluice-team-b", vec!["logs.team-b"], Some("logs.team-b"), 3),
    ];
    for (id, group, topics, keda_topic, max_replicas) in &cases {
        let name = format!("t-sluice-persister-{id}");
        let other = format!("t-sluice-persister-{}", if *id == "team-a" { "team-b" } else { "team-a" });

        let deployment = object(&rendered, "Deployment", &name);
        let spec = pod_spec(deployment).expect("pod spec");
        let selector = &deployment["spec"]["selector"]["matchLabels"];
        assert_eq!(selector["sluice.dev/persister"], *id);
        assert!(selects(selector, &pods(&name)), "{name} selects its own pods");
        assert!(!selects(selector, &pods(&other)), "{name} does not select {other}'s pods");
        let url = spec["containers"][0]["env"]
            .as_sequence()
            .expect("env")
            .iter()
            .find(|e| e["name"] == "SLUICE_POSTGRES__URL");
        let url = &url.expect("the PostgreSQL URL")["valueFrom"]["secretKeyRef"];
        assert_eq!(
            (url["name"].as_str(), url["key"].as_str()),
            (Some(format!("sluice-postgres-{id}").as_str()), Some("url"))
        );
        assert_eq!(spec["volumes"][0]["configMap"]["name"], name.as_str(), "its own config");
        assert_eq!(spec["serviceAccountName"], name.as_str());
        assert!(deployment["spec"].get("replicas").is_none(), "{name}: KEDA sets its replicas");

        let config = &object(&rendered, "ConfigMap", &name)["data"]["persist.toml"];
        let config: toml::Table = toml::from_str(config.as_str().expect("persist.toml")).expect("TOML");
        assert_eq!(config["persist"]["group_id"].as_str(), Some(*group), "{name}");
        let read: Vec<&str> =
            config["persist"]["topics"].as_array().expect("topics").iter().filter_map(|t| t.as_str()).collect();
        assert_eq!(&read, topics, "{name}");
        assert_eq!(config["kafka"]["topic"].as_str(), Some("logs.{pod.namespace}"), "{name}: the agents' routing");

        let scaled = object(&rendered, "ScaledObject", &name);
        assert_eq!(scaled["spec"]["scaleTargetRef"]["name"], name.as_str());
        assert_eq!(scaled["spec"]["maxReplicaCount"], *max_replicas, "{name}: its own keda values");
        let trigger = &scaled["spec"]["triggers"][0]["metadata"];
        assert_eq!(trigger["consumerGroup"].as_str(), Some(*group), "{name}");
        assert_eq!(trigger["topic"].as_str(), *keda_topic, "{name}: a pattern names no topic, one name does");

        let budget = object(&rendered, "PodDisruptionBudget", &name);
        let covers = &budget["spec"]["selector"]["matchLabels"];
        assert!(
            selects(covers, &pods(&name)) && !selects(covers, &pods(&other)),
            "{name}'s budget covers its pods only"
        );
        let service = object(&rendered, "Service", &name);
        assert!(!selects(&service["spec"]["selector"], &pods(&other)), "{name}'s Service");
        assert_eq!(
            service["metadata"]["labels"]["app.kubernetes.io/component"], "persister",
            "the ServiceMonitor's selector"
        );
        object(&rendered, "ServiceAccount", &name);
    }
    let checksums: Vec<&Value> = cases
        .iter()
        .map(|(id, ..)| {
            &object(&rendered, "Deployment", &format!("t-sluice-persister-{id}"))["spec"]["template"]["metadata"]
                ["annotations"]["checksum/config"]
        })
        .collect();
    assert_ne!(checksums[0], checksums[1], "each rolls on its own config");
    assert!(
        !rendered.iter().any(|d| d["metadata"]["name"] == "t-sluice-persister"),
        "with a list, `persister` is only the defaults"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("several-clusters.yaml");
    std::fs::write(&file, &text).expect("write");
    assert_validates_strictly(&file, "the README's several clusters");
}

#[test]
fn an_empty_persisters_list_renders_the_one_persister_as_before() {
    let defaults = render(&["persister.keda.enabled=true"]);
    assert_eq!(render_values("persisters: []\n", &["persister.keda.enabled=true"]), defaults);
    assert!(!defaults.contains("sluice.dev/persister"), "no label of the list");
    let rendered = documents(&defaults);
    for kind in ["ConfigMap", "Deployment", "Service", "ServiceAccount", "PodDisruptionBudget", "ScaledObject"] {
        let persisters: Vec<&Value> = rendered
            .iter()
            .filter(|d| d["kind"] == kind && d["metadata"]["labels"]["app.kubernetes.io/component"] == "persister")
            .collect();
        assert_eq!(persisters.len(), 1, "one {kind}");
        assert_eq!(persisters[0]["metadata"]["name"], "t-sluice-persister", "{kind}");
    }
    let selector = &object(&rendered, "Deployment", "t-sluice-persister")["spec"]["selector"]["matchLabels"];
    let expected: Value = serde_norway::from_str(
        "{app.kubernetes.io/name: sluice, app.kubernetes.io/instance: t, app.kubernetes.io/component: persister}",
    )
    .expect("yaml");
    assert_eq!(*selector, expected, "a Deployment's selector cannot change on upgrade");
    let trigger = &object(&rendered, "ScaledObject", "t-sluice-persister")["spec"]["triggers"][0]["metadata"];
    assert_eq!(
        (trigger["consumerGroup"].as_str(), trigger["topic"].as_str()),
        (Some("sluice-persist"), Some("sluice-logs"))
    );
}

/// `helm template`'s error for `values`; it must fail.
fn refusal(values: &str) -> String {
    let output = template(values, &[]);
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(!output.status.success(), "rendered:\n{values}");
    stderr
}

#[test]
fn duplicate_persister_names_are_refused_at_render() {
    let stderr = refusal(
        "persisters:
  - {name: team-a, config: {persist: {group_id: a, topics: [logs.a]}}}
  - {name: team-a, config: {persist: {group_id: b, topics: [logs.b]}}}
",
    );
    assert!(stderr.contains(r#"persisters: two items are named "team-a""#), "{stderr}");
}

#[test]
fn duplicate_consumer_groups_are_refused_at_render() {
    // Named alike, or one left at persister's default group_id by both.
    for (values, group) in [
        (
            "persisters:
  - {name: team-a, config: {persist: {group_id: logs, topics: [logs.a]}}}
  - {name: team-b, config: {persist: {group_id: logs, topics: [logs.b]}}}
",
            "logs",
        ),
        (
            "persisters:
  - {name: team-a, config: {persist: {topics: [logs.a]}}}
  - {name: team-b, config: {persist: {topics: [logs.b]}}}
",
            "sluice-persist",
        ),
    ] {
        let stderr = refusal(values);
        let expected = format!(r#"persisters: "team-a" and "team-b" both use consumer group "{group}""#);
        assert!(stderr.contains(&expected), "{stderr}");
    }
    // A disabled item is not deployed, so it takes no group.
    render_values(
        "persisters:
  - {name: team-a, config: {persist: {group_id: logs, topics: [logs.a]}}}
  - {name: team-b, enabled: false, config: {persist: {group_id: logs, topics: [logs.b]}}}
",
        &[],
    );
}

#[test]
fn a_topic_read_by_two_persisters_or_by_default_is_refused_at_render() {
    let stderr = refusal(
        "persisters:
  - {name: team-a, config: {persist: {group_id: a, topics: ['^logs\\..*']}}}
  - {name: team-b, config: {persist: {group_id: b, topics: [logs.b, '^logs\\..*']}}}
",
    );
    assert!(stderr.contains(r#""team-a" and "team-b" both read "^logs\\..*""#), "{stderr}");
    let stderr = refusal(
        "persisters:
  - {name: team-a, config: {persist: {group_id: a, topics: [logs.a]}}}
  - {name: team-b, config: {persist: {group_id: b}}}
",
    );
    assert!(stderr.contains(r#""team-b" sets no config.persist.topics"#), "{stderr}");
    // One persister of a list may read the default topics, like `persister` alone.
    render_values("persisters: [{name: only}]\n", &[]);
}

#[test]
fn a_native_sidecar_is_refused_below_kubernetes_1_29_and_the_regular_one_renders() {
    let chart = chart();
    let output = helm(&["template", "t", chart.as_str(), "--kube-version", "1.28.0", "--set", "example.enabled=true"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("set sidecar.native=false"), "{stderr}");
    let output = helm(&[
        "template",
        "t",
        chart.as_str(),
        "--kube-version",
        "1.28.0",
        "--set",
        "example.enabled=true",
        "--set",
        "sidecar.native=false",
    ]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

/// helm/examples/app and the sluice chart, laid out as in the repository (its dependency is
/// `file://../../sluice`) in a temporary directory, its `charts/` built there by Helm.
fn parent_chart() -> (tempfile::TempDir, String) {
    fn copy(from: &std::path::Path, to: &std::path::Path) {
        std::fs::create_dir_all(to).expect("mkdir");
        for entry in std::fs::read_dir(from).expect("read_dir") {
            let entry = entry.expect("entry");
            let target = to.join(entry.file_name());
            if entry.file_type().expect("file type").is_dir() {
                if entry.file_name() != "charts" {
                    copy(&entry.path(), &target);
                }
            } else {
                std::fs::copy(entry.path(), &target).expect("copy");
            }
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    copy(&source_path("helm/sluice"), &dir.path().join("sluice"));
    let app = dir.path().join("examples/app");
    copy(&source_path("helm/examples/app"), &app);
    let app = app.display().to_string();
    let output = helm(&["dependency", "build", "--skip-refresh", app.as_str()]);
    assert!(output.status.success(), "helm dependency build: {}", String::from_utf8_lossy(&output.stderr));
    (dir, app)
}

fn render_parent(app: &str, sets: &[&str]) -> std::process::Output {
    let mut args = vec!["template", "shop", app, "--kube-version", "1.29.0"];
    for set in sets {
        args.extend(["--set", set]);
    }
    helm(&args)
}

#[test]
fn an_apps_chart_with_sluice_as_a_dependency_renders_validates_and_runs_sluices_image() {
    let (_dir, app) = parent_chart();
    let lint = helm(&["lint", "--strict", app.as_str(), "--kube-version", "1.29.0"]);
    assert!(lint.status.success(), "helm lint: {}", String::from_utf8_lossy(&lint.stdout));
    let sluice_version = {
        let chart: Value =
            serde_norway::from_str(include_str!("../../helm/sluice/Chart.yaml")).expect("helm/sluice/Chart.yaml");
        chart["appVersion"].as_str().expect("appVersion").to_string()
    };
    // `global` is what Helm hands every subchart (helm/helm#10392): the schema takes it.
    for (name, sets) in [
        ("defaults", vec!["global.imageRegistry=registry.example.com"]),
        ("regular sidecar", vec!["sluice.sidecar.native=false"]),
        ("with persisters", vec!["sluice.persister.enabled=true"]),
    ] {
        let output = render_parent(&app, &sets);
        assert!(output.status.success(), "{name}: {}", String::from_utf8_lossy(&output.stderr));
        let text = String::from_utf8(output.stdout).expect("utf-8");
        let file = std::path::Path::new(&app).join(format!("{}.rendered.yaml", name.replace(' ', "-")));
        std::fs::write(&file, &text).expect("write");
        assert_validates_strictly(&file, name);
        let shop = documents(&text)
            .into_iter()
            .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "shop-shop")
            .expect("the app's Deployment");
        let spec = pod_spec(&shop).expect("pod spec");
        let all = spec["containers"].as_sequence().into_iter().flatten();
        let init = spec.get("initContainers").and_then(Value::as_sequence).into_iter().flatten();
        let containers: Vec<&Value> = all.chain(init).collect();
        let agent = containers.iter().find(|c| c["name"] == "sluice").expect("the sidecar");
        assert_eq!(
            agent["image"],
            format!("ghcr.io/sluice-logs/sluice:{sluice_version}"),
            "{name}: sluice's appVersion"
        );
        let app_container = containers.iter().find(|c| c["name"] == "shop").expect("the app");
        assert_eq!(app_container["image"], "registry.example.com/shop:7.3.1", "{name}: the app's own");
        assert_eq!(agent["ports"][0]["containerPort"], 9470, "{name}: the parent's sluice values reach the sidecar");
        assert_eq!(spec["terminationGracePeriodSeconds"], 45, "{name}: 15 s shop + 25 s drain + 5 s");
        assert_eq!(spec["securityContext"]["fsGroup"], 65532, "{name}");
        let config = documents(&text)
            .into_iter()
            .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "shop-sluice-agent")
            .expect("the agent's ConfigMap");
        assert!(config["data"]["agent.toml"].as_str().unwrap_or_default().contains("kafka.logging:9092"), "{name}");
    }

    // sluice.enabled=false (the dependency's condition): no agent, no sidecar.
    let output = render_parent(&app, &["sluice.enabled=false"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(!String::from_utf8_lossy(&output.stdout).contains("sluice"));

    // The old way, a dict with the parent's .Chart, is refused instead of running the app's tag.
    let dict = "{{- $ctx := dict \"Values\" .Values.sluice \"Release\" .Release \"Chart\" .Chart }}\n\
                apiVersion: v1\nkind: List\nitems: []\n# {{ include \"sluice.sidecar.container\" $ctx }}\n";
    std::fs::write(std::path::Path::new(&app).join("templates/dict.yaml"), dict).expect("write");
    let output = render_parent(&app, &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains(".Subcharts.sluice"), "{stderr}");
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
            "namespaceSelector",
            "securityContext",
            "podSecurityContext",
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

/// The Prometheus Operator objects in `documents`, by kind.
fn monitoring_object<'a>(documents: &'a [Value], kind: &str) -> &'a Value {
    documents.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("a {kind}"))
}

#[test]
fn monitoring_plugs_into_kube_prometheus_stack_and_labels_workload_and_job() {
    let rendered = documents(&render(KUBE_PROMETHEUS_STACK));
    let service = monitoring_object(&rendered, "ServiceMonitor");
    let pods = monitoring_object(&rendered, "PodMonitor");
    let rule = monitoring_object(&rendered, "PrometheusRule");

    // The shared labels on all three; an object's own win.
    assert_eq!(service["metadata"]["labels"]["release"], "kps");
    assert_eq!(pods["metadata"]["labels"]["release"], "kps-agents");
    assert_eq!(rule["metadata"]["labels"]["release"], "kps");
    assert_eq!(rule["metadata"]["labels"]["team"], "platform");

    // Every series gets `workload` and `job`, the labels the alerts aggregate by; one's own
    // relabelings come after the chart's, so they may override them.
    for (monitor, endpoints, job) in
        [(service, "endpoints", "sluice-persister"), (pods, "podMetricsEndpoints", "sluice-agent")]
    {
        let relabelings = monitor["spec"][endpoints][0]["relabelings"].as_sequence().expect("relabelings");
        let targets: Vec<&str> = relabelings.iter().filter_map(|r| r["targetLabel"].as_str()).collect();
        assert!(targets.starts_with(&["workload", "workload", "workload", "workload", "job"]), "{job}: {targets:?}");
        let owner = relabelings
            .iter()
            .find(|r| r["regex"].as_str().is_some_and(|regex| regex.starts_with("ReplicaSet;")))
            .expect("a Deployment's pods are its workload");
        assert_eq!(owner["sourceLabels"][1], "__meta_kubernetes_pod_controller_name");
        let set_job = relabelings.iter().find(|r| r["targetLabel"] == "job").expect("job");
        assert_eq!(set_job["replacement"], job);
    }
    let agents = pods["spec"]["podMetricsEndpoints"][0]["relabelings"].as_sequence().expect("relabelings");
    let last = agents.last().expect("relabelings");
    assert_eq!((last["targetLabel"].as_str(), last["replacement"].as_str()), (Some("cluster"), Some("eu-1")));
    assert_eq!(service["spec"]["endpoints"][0]["metricRelabelings"][0]["action"], "drop");

    // Namespaces: the persisters' Service in the release's; app pods where asked.
    assert_eq!(service["spec"]["namespaceSelector"]["matchNames"][0], "default");
    assert_eq!(pods["spec"]["namespaceSelector"]["matchNames"][0], "shop");

    // By default the PodMonitor looks in every namespace: app pods live anywhere.
    let defaults = documents(&render(&["monitoring.podMonitor.enabled=true"]));
    assert_eq!(monitoring_object(&defaults, "PodMonitor")["spec"]["namespaceSelector"]["any"], true);

    // The rules shipped are the tested ones (monitoring/alerts.yml links to the chart's copy).
    let rules: Value = serde_norway::from_str(include_str!("../../monitoring/alerts.yml")).expect("alerts.yml");
    assert_eq!(rule["spec"]["groups"], rules["groups"]);
}
