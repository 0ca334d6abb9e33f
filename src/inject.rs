//! `sluice inject`: adds the agent to Kubernetes workloads as a sidecar, for teams that do not
//! use Helm: `kubectl get deploy x -o yaml | sluice inject | kubectl apply -f -`.
//!
//! Owns: finding the pod template in each workload kind, and adding exactly what the chart's
//! named templates (`helm/sluice/templates/_sidecar.tpl`) add — the agent container (a native
//! sidecar by default), the socket/config/spool volumes, and `SLUICE_SOCKET` plus the socket
//! mount in the app containers. `tests/it/chart.rs` renders the chart and checks both agree.
//!
//! Must not: change anything else in a manifest, inject twice (a pod that already has a
//! container named `sluice` is left as it is), or guess: a workload it cannot read is an error
//! naming the document; kinds without a pod template (Services, ConfigMaps…) pass through.

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
    /// The agent's admin port.
    pub admin_port: u16,
    /// `disk` (a spool on an emptyDir) or `memory`.
    pub buffer: String,
    /// The spool emptyDir's size limit.
    pub spool_size_limit: String,
    /// The regular sidecar's preStop wait.
    pub pre_stop_wait: String,
    /// Secret librdkafka properties: (env var, secret name, secret key).
    pub secret_env: Vec<(String, String, String)>,
}

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
        }
    }
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
pub fn inject(input: &str, options: &Options) -> Result<String, InjectError> {
    let mut out = String::new();
    for (index, document) in serde_norway::Deserializer::from_str(input).enumerate() {
        let number = index + 1;
        let mut value: Value = serde::Deserialize::deserialize(document)
            .map_err(|source| InjectError::Yaml { document: number, source })?;
        if value.is_null() {
            continue;
        }
        inject_value(&mut value, number, options)?;
        if !out.is_empty() {
            out.push_str("---\n");
        }
        out.push_str(
            &serde_norway::to_string(&value).map_err(|source| InjectError::Yaml { document: number, source })?,
        );
    }
    Ok(out)
}

fn inject_value(value: &mut Value, document: usize, options: &Options) -> Result<(), InjectError> {
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
    if kind == "List" {
        if let Some(items) = value.get_mut("items").and_then(Value::as_sequence_mut) {
            for item in items {
                inject_value(item, document, options)?;
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
    inject_pod(spec, options).map_err(|problem| fail(&problem))
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

fn inject_pod(spec: &mut Mapping, options: &Options) -> Result<(), String> {
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
    let sidecar = sidecar_container(options, &app);
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
    value: {app:?}{secret_env}
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
  runAsUser: 65532
  runAsGroup: 65532
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
