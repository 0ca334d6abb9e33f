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
    let out = inject(DEPLOYMENT, &Options::default()).expect("inject").manifest;
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
    let twice = inject(&once.manifest, &Options::default()).expect("inject again");
    assert_eq!(once.manifest, twice.manifest);
    assert!(twice.notes.is_empty(), "nothing changed, nothing said: {:?}", twice.notes);
}

#[test]
fn a_regular_sidecar_goes_with_the_containers_and_waits_before_stopping() {
    let options = Options { native: false, buffer: "memory".into(), ..Options::default() };
    let out = inject(DEPLOYMENT, &options).expect("inject").manifest;
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
    let docs = parsed(&inject(text, &Options::default()).expect("inject").manifest);
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

fn injected(text: &str, options: &Options) -> (Value, Vec<String>) {
    let out = inject(text, options).expect("inject");
    (parsed(&out.manifest).remove(0), out.notes)
}

#[test]
fn sets_an_fs_group_so_an_app_of_another_uid_can_write_to_the_socket_and_says_so() {
    let (doc, notes) = injected(DEPLOYMENT, &Options::default());
    assert_eq!(pod_spec(&doc)["securityContext"]["fsGroup"], 65532);
    assert!(
        notes.iter().any(|n| n.contains("document 1 (Deployment shop): set securityContext.fsGroup 65532")),
        "{notes:?}"
    );
    let sidecar = &pod_spec(&doc)["initContainers"][0]["securityContext"];
    assert!(sidecar.get("runAsUser").is_none(), "no uid pinned: OpenShift's SCC assigns its own");
    assert_eq!(sidecar["runAsNonRoot"], true);
}

#[test]
fn keeps_the_pods_own_fs_group_whatever_it_is() {
    let pod = DEPLOYMENT.replace(
        "    spec:\n      containers:",
        "    spec:\n      securityContext: {runAsUser: 1000, runAsGroup: 3000, fsGroup: 2000}\n      containers:",
    );
    let (doc, notes) = injected(&pod, &Options::default());
    let context = &pod_spec(&doc)["securityContext"];
    assert_eq!((context["fsGroup"].as_u64(), context["runAsGroup"].as_u64()), (Some(2000), Some(3000)));
    assert!(!notes.iter().any(|n| n.contains("fsGroup")), "{notes:?}");
}

#[test]
fn without_an_fs_group_warns_about_containers_outside_the_agents_group() {
    let options = Options { fs_group: None, ..Options::default() };
    let (doc, notes) = injected(DEPLOYMENT, &options);
    assert!(pod_spec(&doc).get("securityContext").is_none(), "left unset for the platform to assign");
    assert!(notes.iter().any(|n| n.contains("WARNING: no fsGroup") && n.contains("containers web")), "{notes:?}");

    let shared = DEPLOYMENT.replace(
        "    spec:\n      containers:",
        "    spec:\n      securityContext: {runAsGroup: 65532}\n      containers:",
    );
    let (_, notes) = injected(&shared, &options);
    assert!(notes.iter().all(|n| !n.contains("WARNING")), "the app runs in the agent's group: {notes:?}");
}

#[test]
fn a_pod_running_as_root_gets_a_non_root_agent() {
    let root = DEPLOYMENT
        .replace("    spec:\n      containers:", "    spec:\n      securityContext: {runAsUser: 0}\n      containers:");
    let (doc, notes) = injected(&root, &Options::default());
    assert_eq!(pod_spec(&doc)["initContainers"][0]["securityContext"]["runAsUser"], 65532);
    assert!(notes.iter().any(|n| n.contains("uid 0")), "{notes:?}");
}

#[test]
fn raises_the_grace_period_to_the_apps_shutdown_plus_the_drain_and_keeps_a_longer_one() {
    let (doc, notes) = injected(DEPLOYMENT, &Options::default());
    assert_eq!(pod_spec(&doc)["terminationGracePeriodSeconds"], 40, "10 s app + 25 s drain + 5 s");
    assert!(notes.iter().any(|n| n.contains("terminationGracePeriodSeconds 40 (was unset, 30 s)")), "{notes:?}");

    let options = Options {
        drain_timeout: Duration::from_millis(60_500),
        app_shutdown: Duration::from_secs(0),
        ..Options::default()
    };
    assert_eq!(injected(DEPLOYMENT, &options).0["spec"]["template"]["spec"]["terminationGracePeriodSeconds"], 66);
    let regular = Options { native: false, pre_stop_wait: "15s".into(), ..Options::default() };
    assert_eq!(regular.grace_period_seconds(), 45, "the preStop wait, when longer than the app's shutdown");

    let short = DEPLOYMENT.replace(
        "    spec:\n      containers:",
        "    spec:\n      terminationGracePeriodSeconds: 12\n      containers:",
    );
    let (doc, notes) = injected(&short, &Options::default());
    assert_eq!(pod_spec(&doc)["terminationGracePeriodSeconds"], 40);
    assert!(notes.iter().any(|n| n.contains("(was 12 s)")), "{notes:?}");

    let long = DEPLOYMENT.replace(
        "    spec:\n      containers:",
        "    spec:\n      terminationGracePeriodSeconds: 120\n      containers:",
    );
    let (doc, notes) = injected(&long, &Options::default());
    assert_eq!(pod_spec(&doc)["terminationGracePeriodSeconds"], 120);
    assert!(!notes.iter().any(|n| n.contains("terminationGracePeriodSeconds")), "{notes:?}");
}

#[test]
fn the_admin_port_is_the_containers_and_the_agents() {
    let options = Options { admin_port: 9100, ..Options::default() };
    let (doc, _) = injected(DEPLOYMENT, &options);
    let sidecar = &pod_spec(&doc)["initContainers"][0];
    assert_eq!(sidecar["ports"][0]["containerPort"], 9100);
    let env = sidecar["env"].as_sequence().expect("env");
    let listen = env.iter().find(|var| var["name"] == "SLUICE_AGENT__ADMIN_LISTEN").expect("admin listen");
    assert_eq!(listen["value"], "0.0.0.0:9100", "whatever the ConfigMap says, the probes find the agent");
}

#[test]
fn refuses_a_windows_pod() {
    let windows =
        DEPLOYMENT.replace("    spec:\n      containers:", "    spec:\n      os: {name: windows}\n      containers:");
    let error = inject(&windows, &Options::default()).expect_err("windows");
    assert!(error.to_string().contains("Linux"), "{error}");
}
