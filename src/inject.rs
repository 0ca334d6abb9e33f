//! `sluice inject`: adds the agent to Kubernetes workloads as a sidecar, for teams that do not
//! use Helm: `kubectl get deploy x -o yaml | sluice inject | kubectl apply -f -`.
//!
//! Owns: finding the pod template in each workload kind, and adding exactly what the chart's
//! named templates (`helm/sluice/templates/_sidecar.tpl`) add — the agent container (a native
//! sidecar by default), the socket/config/spool volumes, `SLUICE_SOCKET` plus the socket mount
//! in the app containers, and the two pod settings a first run trips on: `securityContext.fsGroup`
//! (so an app of another uid/gid may write to the 0660 socket) and a
//! `terminationGracePeriodSeconds` that holds the app's shutdown and the agent's drain.
//! `tests/it/chart.rs` renders the chart and checks both agree.
//!
//! Why an existing `fsGroup` is kept, whatever its value: Kubernetes makes the socket's emptyDir
//! group-owned by it and setgid, so the socket (bound in a directory inside it) takes that group,
//! and adds it to every container's groups, the app's and the agent's alike — any `fsGroup` lets
//! the app connect; no `runAsGroup` can take it away. Only a pod with none needs one set.
//!
//! Must not: change anything else in a manifest, lower a setting the pod already has, inject
//! twice (a pod that already has a container named `sluice` is left as it is), or guess: a
//! workload it cannot read is an error naming the document; kinds without a pod template
//! (Services, ConfigMaps…) pass through. What it changed or could not check is said in
//! [`Injected::notes`] (the CLI prints them on stderr), never silently.

use std::time::Duration;

use serde_norway::{Mapping, Value};

/// The sidecar's settings; the defaults are the chart's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// The sluice image.
    pub image: String,
    /// `imagePullPolicy` of the agent container.
    pub pull_policy: String,
    /// The ConfigMap holding `agent.toml` (the chart creates `<release>-sluice-agent`).
    pub config_map: String,
    /// A native sidecar (init container with `restartPolicy: Always`, Kubernetes ≥ 1.29), or a
    /// regular container with a preStop wait.
    pub native: bool,
    /// The app container whose logs these are; default: the pod's first container.
    pub app_container: Option<String>,
    /// The agent's admin port: the container port and, through `SLUICE_AGENT__ADMIN_LISTEN`,
    /// where the agent listens whatever its ConfigMap says (9464 by default, which is also
    /// OpenTelemetry's Prometheus exporter's default: choose another if the app uses that).
    pub admin_port: u16,
    /// `disk` (a spool on an emptyDir) or `memory`.
    pub buffer: String,
    /// The spool emptyDir's size limit.
    pub spool_size_limit: String,
    /// The regular sidecar's preStop wait.
    pub pre_stop_wait: String,
    /// Secret librdkafka properties: (env var, secret name, secret key).
    pub secret_env: Vec<(String, String, String)>,
    /// The pod's `securityContext.fsGroup` when it has none (`None`: leave it unset, for
    /// platforms that assign one, such as OpenShift's restricted SCC).
    pub fs_group: Option<u32>,
    /// The agent's `agent.drain_timeout` (in the ConfigMap; the chart's default is 25s).
    pub drain_timeout: Duration,
    /// How long the app takes to stop on SIGTERM.
    pub app_shutdown: Duration,
}

/// The uid and gid the image runs as (the Dockerfile's `USER 65532:65532`).
pub const AGENT_ID: u32 = 65532;

/// After its drain deadline the agent still closes the producer (`ship::CLOSE_GRACE`) and counts
/// what is left: the grace period keeps this much beyond the drain. The chart's
/// `sluice.sidecar.terminationGracePeriodSeconds` adds the same.
pub const AGENT_EXIT_MARGIN: Duration = Duration::from_secs(5);

impl Default for Options {
    fn default() -> Self {
        Self {
            image: format!("ghcr.io/sluice-logs/sluice:{}", env!("CARGO_PKG_VERSION")),
            pull_policy: "IfNotPresent".into(),
            config_map: "sluice-sluice-agent".into(),
            native: true,
            app_container: None,
            admin_port: 9464,
            buffer: "disk".into(),
            spool_size_limit: "512Mi".into(),
            pre_stop_wait: "5s".into(),
            secret_env: Vec::new(),
            fs_group: Some(AGENT_ID),
            drain_timeout: Duration::from_secs(25),
            app_shutdown: Duration::from_secs(10),
        }
    }
}

impl Options {
    /// The least `terminationGracePeriodSeconds` that lets the app stop and the agent drain:
    /// native, the agent gets SIGTERM once the app has exited; regular, both get it at once, after
    /// the agent's preStop wait.
    pub fn grace_period_seconds(&self) -> u64 {
        // Whole seconds, each part rounded up, as the chart's template adds them.
        let seconds = |duration: Duration| duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
        let before_drain = if self.native {
            seconds(self.app_shutdown)
        } else {
            let pre_stop = humantime::parse_duration(&self.pre_stop_wait).unwrap_or_default();
            seconds(self.app_shutdown).max(seconds(pre_stop))
        };
        before_drain + seconds(self.drain_timeout) + AGENT_EXIT_MARGIN.as_secs()
    }
}

/// The injected manifest, and what the operator should hear about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Injected {
    /// The manifest, every workload with the sidecar.
    pub manifest: String,
    /// One line per setting changed or risk seen, naming the document (for stderr).
    pub notes: Vec<String>,
}

/// Why a manifest could not be injected.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    /// Not YAML.
    #[error("document {document}: not YAML: {source}")]
    Yaml {
        /// 1-based document number.
        document: usize,
        /// The parser's error.
        source: serde_norway::Error,
    },
    /// A workload whose pod template cannot be read.
    #[error("document {document} ({kind} {name}): {problem}")]
    Workload {
        /// 1-based document number.
        document: usize,
        /// Its kind.
        kind: String,
        /// Its name.
        name: String,
        /// What is wrong.
        problem: String,
    },
}

const SIDECAR: &str = "sluice";
const SOCKET_DIR: &str = "/run/sluice";
const SOCKET: &str = "/run/sluice/sluice.sock";

/// Injects the sidecar into every workload of a (multi-document) YAML stream.
pub fn inject(input: &str, options: &Options) -> Result<Injected, InjectError> {
    let mut out = String::new();
    let mut notes = Vec::new();
    for (index, document) in serde_norway::Deserializer::from_str(input).enumerate() {
        let number = index + 1;
        let mut value: Value = serde::Deserialize::deserialize(document)
            .map_err(|source| InjectError::Yaml { document: number, source })?;
        if value.is_null() {
            continue;
        }
        inject_value(&mut value, number, options, &mut notes)?;
        if !out.is_empty() {
            out.push_str("---\n");
        }
        out.push_str(
            &serde_norway::to_string(&value).map_err(|source| InjectError::Yaml { document: number, source })?,
        );
    }
    Ok(Injected { manifest: out, notes })
}

fn inject_value(
    value: &mut Value,
    document: usize,
    options: &Options,
    notes: &mut Vec<String>,
) -> Result<(), InjectError> {
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
    if kind == "List" {
        if let Some(items) = value.get_mut("items").and_then(Value::as_sequence_mut) {
            for item in items {
                inject_value(item, document, options, notes)?;
            }
        }
        return Ok(());
    }
    let name = value.get("metadata").and_then(|m| m.get("name")).and_then(Value::as_str).unwrap_or("?").to_string();
    let fail = |problem: &str| InjectError::Workload {
        document,
        kind: kind.clone(),
        name: name.clone(),
        problem: problem.into(),
    };
    let template: &mut Value = match kind.as_str() {
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" => {
            path_mut(value, &["spec", "template"]).ok_or_else(|| fail("no spec.template"))?
        }
        "CronJob" => path_mut(value, &["spec", "jobTemplate", "spec", "template"])
            .ok_or_else(|| fail("no spec.jobTemplate.spec.template"))?,
        "Pod" => value,
        _ => return Ok(()), // no pod template: passed through unchanged
    };
    if let Some(labels) = mapping_at(template, &["metadata", "labels"]) {
        labels.insert("sluice.dev/sidecar".into(), "true".into());
    }
    let spec = template.get_mut("spec").and_then(Value::as_mapping_mut).ok_or_else(|| fail("no pod spec"))?;
    let mut said = Vec::new();
    inject_pod(spec, options, &mut said).map_err(|problem| fail(&problem))?;
    notes.extend(said.into_iter().map(|note| format!("document {document} ({kind} {name}): {note}")));
    Ok(())
}

fn path_mut<'a>(value: &'a mut Value, path: &[&str]) -> Option<&'a mut Value> {
    path.iter().try_fold(value, |value, key| value.get_mut(*key))
}

/// The mapping at `path`, created (as empty mappings) where missing.
fn mapping_at<'a>(value: &'a mut Value, path: &[&str]) -> Option<&'a mut Mapping> {
    let mut current = value;
    for key in path {
        let map = current.as_mapping_mut()?;
        current = map.entry((*key).into()).or_insert_with(|| Value::Mapping(Mapping::new()));
    }
    current.as_mapping_mut()
}

fn sequence<'a>(spec: &'a mut Mapping, key: &str) -> Result<&'a mut Vec<Value>, String> {
    spec.entry(key.into())
        .or_insert_with(|| Value::Sequence(Vec::new()))
        .as_sequence_mut()
        .ok_or_else(|| format!("{key} is not a list"))
}

fn named(list: &[Value], name: &str) -> bool {
    list.iter().any(|item| item.get("name").and_then(Value::as_str) == Some(name))
}

fn inject_pod(spec: &mut Mapping, options: &Options, notes: &mut Vec<String>) -> Result<(), String> {
    if spec.get("os").and_then(|os| os.get("name")).and_then(Value::as_str) == Some("windows") {
        return Err("spec.os.name is windows: the agent and its Unix socket need a Linux pod".into());
    }
    let containers = sequence(spec, "containers")?;
    if containers.is_empty() {
        return Err("the pod has no containers".into());
    }
    let already = named(containers, SIDECAR)
        || spec.get("initContainers").and_then(Value::as_sequence).is_some_and(|init| named(init, SIDECAR));
    if already {
        return Ok(()); // injecting twice changes nothing
    }
    let containers = sequence(spec, "containers")?;
    let app = match &options.app_container {
        Some(app) if named(containers, app) => app.clone(),
        Some(app) => return Err(format!("no container named {app}")),
        None => containers[0].get("name").and_then(Value::as_str).ok_or("the first container has no name")?.to_string(),
    };
    for container in containers.iter_mut() {
        let container = container.as_mapping_mut().ok_or("a container is not a mapping")?;
        let env = sequence(container, "env")?;
        if !named(env, "SLUICE_SOCKET") {
            env.push(yaml(&format!("{{name: SLUICE_SOCKET, value: {SOCKET}}}")));
        }
        let mounts = sequence(container, "volumeMounts")?;
        if !named(mounts, "sluice-socket") {
            mounts.push(yaml(&format!("{{name: sluice-socket, mountPath: {SOCKET_DIR}}}")));
        }
    }
    let mut sidecar = sidecar_container(options, &app);
    pod_security(spec, options, &mut sidecar, notes)?;
    grace_period(spec, options, notes)?;
    if options.native {
        sequence(spec, "initContainers")?.push(sidecar);
    } else {
        sequence(spec, "containers")?.push(sidecar);
    }
    let volumes = sequence(spec, "volumes")?;
    for volume in sidecar_volumes(options) {
        let name = volume.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
        if !named(volumes, &name) {
            volumes.push(volume);
        }
    }
    Ok(())
}

/// The pod's `fsGroup`, so the app may write to the 0660 socket (see the module's doc); and the
/// agent's uid where the pod would run it as root.
fn pod_security(
    spec: &mut Mapping,
    options: &Options,
    sidecar: &mut Value,
    notes: &mut Vec<String>,
) -> Result<(), String> {
    let context = match spec.get("securityContext") {
        None | Some(Value::Null) => Mapping::new(),
        Some(Value::Mapping(context)) => context.clone(),
        Some(_) => return Err("securityContext is not a mapping".into()),
    };
    // The sidecar pins no uid (OpenShift's restricted SCC assigns its own), so it inherits the
    // pod's: root would fail its runAsNonRoot. The image's own user, then.
    if context.get("runAsUser").and_then(Value::as_u64) == Some(0) {
        if let Some(own) = sidecar.get_mut("securityContext").and_then(Value::as_mapping_mut) {
            own.insert("runAsUser".into(), AGENT_ID.into());
        }
        notes.push(format!(
            "the pod runs as uid 0: the agent container is given runAsUser {AGENT_ID} (it refuses root)"
        ));
    }
    if context.contains_key("fsGroup") {
        return Ok(()); // any fsGroup works: the socket takes it, every container has it
    }
    match options.fs_group {
        Some(group) => {
            let mut context = context;
            context.insert("fsGroup".into(), group.into());
            spec.insert("securityContext".into(), Value::Mapping(context));
            notes.push(format!(
                "set securityContext.fsGroup {group}: the socket is mode 0660, and the app may write to it only in that group"
            ));
        }
        None => {
            let pod_group = context.get("runAsGroup").and_then(Value::as_u64);
            let supplemental = context
                .get("supplementalGroups")
                .and_then(Value::as_sequence)
                .is_some_and(|groups| groups.iter().any(|g| g.as_u64() == Some(u64::from(AGENT_ID))));
            let containers = spec.get("containers").and_then(Value::as_sequence).map(Vec::as_slice).unwrap_or_default();
            let outside: Vec<&str> = containers
                .iter()
                .filter(|c| {
                    let group = c.get("securityContext").and_then(|s| s.get("runAsGroup")).and_then(Value::as_u64);
                    !supplemental && group.or(pod_group) != Some(u64::from(AGENT_ID))
                })
                .filter_map(|c| c.get("name").and_then(Value::as_str))
                .collect();
            if !outside.is_empty() {
                notes.push(format!(
                    "WARNING: no fsGroup (--fs-group none) and containers {} may not share the agent's group \
                     ({AGENT_ID}): they cannot write to its 0660 socket unless the platform assigns an fsGroup \
                     (OpenShift's restricted SCC does)",
                    outside.join(", ")
                ));
            }
        }
    }
    Ok(())
}

/// `terminationGracePeriodSeconds` raised to what the app and the agent's drain need; a larger
/// one is kept.
fn grace_period(spec: &mut Mapping, options: &Options, notes: &mut Vec<String>) -> Result<(), String> {
    let needed = options.grace_period_seconds();
    let current = match spec.get("terminationGracePeriodSeconds") {
        None => None,
        Some(value) => Some(value.as_u64().ok_or("terminationGracePeriodSeconds is not a whole number")?),
    };
    if current.is_some_and(|current| current >= needed) {
        return Ok(());
    }
    spec.insert("terminationGracePeriodSeconds".into(), needed.into());
    let was = current.map_or_else(|| "unset, 30 s".to_string(), |current| format!("{current} s"));
    notes.push(format!(
        "set terminationGracePeriodSeconds {needed} (was {was}): the app's shutdown ({}) + the agent's drain \
         ({}) + {} s",
        humantime::format_duration(options.app_shutdown),
        humantime::format_duration(options.drain_timeout),
        AGENT_EXIT_MARGIN.as_secs()
    ));
    Ok(())
}

fn yaml(text: &str) -> Value {
    serde_norway::from_str(text).expect("the sidecar spec's YAML is written in this file")
}

/// The agent container, as `sluice.sidecar.container` renders it.
pub fn sidecar_container(options: &Options, app: &str) -> Value {
    let mut secret_env = String::new();
    for (env, secret, key) in &options.secret_env {
        secret_env.push_str(&format!(
            "\n    - name: {env}\n      valueFrom:\n        secretKeyRef:\n          name: {secret}\n          key: {key}"
        ));
    }
    let restart = if options.native { "\nrestartPolicy: Always" } else { "" };
    let pre_stop = if options.native {
        String::new()
    } else {
        format!(
            "\nlifecycle:\n  preStop:\n    exec:\n      command: [sluice, pre-stop, --wait, {:?}]",
            options.pre_stop_wait
        )
    };
    let spool_mount =
        if options.buffer == "disk" { "\n  - name: sluice-spool\n    mountPath: /var/lib/sluice" } else { "" };
    yaml(&format!(
        r#"name: sluice
image: {image:?}
imagePullPolicy: {pull}{restart}
args: [agent, --config, /etc/sluice/agent.toml]
env:
  - name: POD_NAME
    valueFrom:
      fieldRef:
        fieldPath: metadata.name
  - name: POD_NAMESPACE
    valueFrom:
      fieldRef:
        fieldPath: metadata.namespace
  - name: NODE_NAME
    valueFrom:
      fieldRef:
        fieldPath: spec.nodeName
  - name: POD_IP
    valueFrom:
      fieldRef:
        fieldPath: status.podIP
  - name: HOST_IP
    valueFrom:
      fieldRef:
        fieldPath: status.hostIP
  - name: CONTAINER_NAME
    value: {app:?}
  - name: SLUICE_AGENT__ADMIN_LISTEN
    value: "0.0.0.0:{port}"{secret_env}
ports:
  - name: sluice-admin
    containerPort: {port}
    protocol: TCP
startupProbe:
  httpGet:
    path: /healthz
    port: sluice-admin
  periodSeconds: 1
  failureThreshold: 60
readinessProbe:
  httpGet:
    path: /readyz
    port: sluice-admin
  periodSeconds: 10
livenessProbe:
  httpGet:
    path: /healthz
    port: sluice-admin
  periodSeconds: 20
  failureThreshold: 3{pre_stop}
resources:
  requests:
    cpu: 20m
    memory: 64Mi
  limits:
    memory: 128Mi
securityContext:
  runAsNonRoot: true
  readOnlyRootFilesystem: true
  allowPrivilegeEscalation: false
  capabilities:
    drop: [ALL]
  seccompProfile:
    type: RuntimeDefault
volumeMounts:
  - name: sluice-socket
    mountPath: /run/sluice
  - name: sluice-config
    mountPath: /etc/sluice
    readOnly: true
  - name: sluice-podinfo
    mountPath: /etc/podinfo
    readOnly: true{spool_mount}
"#,
        image = options.image,
        pull = options.pull_policy,
        port = options.admin_port,
    ))
}

/// The volumes, as `sluice.sidecar.volumes` renders them.
pub fn sidecar_volumes(options: &Options) -> Vec<Value> {
    let mut volumes = vec![
        yaml("{name: sluice-socket, emptyDir: {medium: Memory, sizeLimit: 1Mi}}"),
        yaml(&format!("{{name: sluice-config, configMap: {{name: {:?}}}}}", options.config_map)),
        // The pod's labels and annotations (`agent.pod_info`; the chart's config reads them).
        yaml(
            "{name: sluice-podinfo, downwardAPI: {items: [{path: labels, fieldRef: {fieldPath: metadata.labels}}, \
             {path: annotations, fieldRef: {fieldPath: metadata.annotations}}]}}",
        ),
    ];
    if options.buffer == "disk" {
        volumes.push(yaml(&format!("{{name: sluice-spool, emptyDir: {{sizeLimit: {}}}}}", options.spool_size_limit)));
    }
    volumes
}

#[cfg(test)]
mod tests;
