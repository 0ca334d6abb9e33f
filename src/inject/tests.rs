use super::*;

const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: shop
spec:
  replicas: 2
  selector:
    matchLabels: {app: shop}
  template:
    metadata:
      labels: {app: shop}
    spec:
      containers:
        - name: web
          image: shop:1
          env:
            - {name: MODE, value: prod}
"#;

fn parsed(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text).map(|d| serde::Deserialize::deserialize(d).expect("yaml")).collect()
}

fn pod_spec(value: &Value) -> &Value {
    &value["spec"]["template"]["spec"]
}

#[test]
fn adds_a_native_sidecar_the_socket_and_the_volumes() {
    let out = inject(DEPLOYMENT, &Options::default()).expect("inject");
    let doc = &parsed(&out)[0];
    let spec = pod_spec(doc);
    let sidecar = &spec["initContainers"][0];
    assert_eq!(sidecar["name"], "sluice");
    assert_eq!(sidecar["restartPolicy"], "Always");
    let env = sidecar["env"].as_sequence().expect("env");
    let container = env.iter().find(|var| var["name"] == "CONTAINER_NAME").expect("CONTAINER_NAME");
    assert_eq!(container["value"], "web", "CONTAINER_NAME is the app container");
    assert!(env.iter().any(|var| var["name"] == "HOST_IP"), "HOST_IP, for the otlp listener's hostNetwork check");
    let web = &spec["containers"][0];
    assert_eq!(web["env"][0]["name"], "MODE", "the app's own env is kept");
    assert_eq!(web["env"][1]["name"], "SLUICE_SOCKET");
    assert_eq!(web["volumeMounts"][0]["mountPath"], "/run/sluice");
    let volumes: Vec<&str> =
        spec["volumes"].as_sequence().expect("volumes").iter().map(|v| v["name"].as_str().expect("name")).collect();
    assert_eq!(volumes, vec!["sluice-socket", "sluice-config", "sluice-podinfo", "sluice-spool"]);
    assert_eq!(doc["spec"]["template"]["metadata"]["labels"]["sluice.dev/sidecar"], "true");
    assert_eq!(doc["spec"]["replicas"], 2, "nothing else changes");
}

#[test]
fn injecting_twice_changes_nothing() {
    let once = inject(DEPLOYMENT, &Options::default()).expect("inject");
    let twice = inject(&once, &Options::default()).expect("inject again");
    assert_eq!(once, twice);
}

#[test]
fn a_regular_sidecar_goes_with_the_containers_and_waits_before_stopping() {
    let options = Options { native: false, buffer: "memory".into(), ..Options::default() };
    let out = inject(DEPLOYMENT, &options).expect("inject");
    let spec = pod_spec(&parsed(&out)[0]).clone();
    assert!(spec.get("initContainers").is_none());
    let sidecar = &spec["containers"][1];
    assert_eq!(sidecar["name"], "sluice");
    assert!(sidecar.get("restartPolicy").is_none());
    assert_eq!(sidecar["lifecycle"]["preStop"]["exec"]["command"][1], "pre-stop");
    assert_eq!(spec["volumes"].as_sequence().expect("volumes").len(), 3, "no spool with a memory buffer");
}

#[test]
fn handles_every_workload_kind_and_passes_the_rest_through() {
    let text = r#"
apiVersion: v1
kind: Service
metadata: {name: shop}
spec: {ports: [{port: 80}]}
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly}
spec:
  schedule: "0 3 * * *"
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: OnFailure
          containers: [{name: job, image: job:1}]
---
apiVersion: v1
kind: Pod
metadata: {name: once}
spec:
  containers: [{name: main, image: main:1}]
"#;
    let docs = parsed(&inject(text, &Options::default()).expect("inject"));
    assert_eq!(docs.len(), 3);
    assert_eq!(docs[0]["spec"]["ports"][0]["port"], 80, "a Service passes through");
    assert_eq!(docs[1]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"][0]["name"], "sluice");
    assert_eq!(docs[2]["spec"]["initContainers"][0]["name"], "sluice");
}

#[test]
fn refuses_what_it_cannot_read_with_the_document_named() {
    let error =
        inject("kind: Deployment\nmetadata: {name: broken}\nspec: {}\n", &Options::default()).expect_err("no template");
    assert!(error.to_string().contains("document 1 (Deployment broken)"), "{error}");
    let error =
        inject("kind: Pod\nmetadata: {name: p}\nspec:\n  containers: []\n", &Options::default()).expect_err("empty");
    assert!(error.to_string().contains("no containers"), "{error}");
    let options = Options { app_container: Some("nope".into()), ..Options::default() };
    assert!(inject(DEPLOYMENT, &options).expect_err("unknown app").to_string().contains("no container named nope"));
    assert!(inject("kind: [unclosed", &Options::default()).is_err());
}
