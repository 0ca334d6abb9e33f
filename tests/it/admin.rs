//! The admin ports of the real processes: which routes each serves where.

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_is_served_off_loopback_only_where_the_roles_key_enables_it() {
    let pipeline = Scenario::new("adminconfig")
        .set("agent", "admin_listen", "0.0.0.0:0")
        .set("persist", "admin_listen", "0.0.0.0:0")
        .set("persist", "admin_config_endpoint", true)
        .pipeline()
        .await;
    let config = &pipeline.config;
    let (status, body) = http_get(config.agent_admin(), "/config").await.expect("agent /config");
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("set agent.admin_config_endpoint = true"), "{body}");
    assert_eq!(http_get(config.agent_admin(), "/metrics").await.expect("agent /metrics").0, 200);

    let (status, body) = http_get(config.persist_admin(), "/config").await.expect("persister /config");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("admin_config_endpoint = true") && body.contains("[postgres]"), "{body}");
}
