//! The server is killed (SIGKILL, no shutdown) right after the last acknowledged write and comes
//! back: operations fail with `unreachable` while it is down, succeed once it is back, and no
//! acknowledged state is lost.

use integration_tests::state_host::{Error, State};
use integration_tests::{LocalServer, json, runtime};

#[tokio::test]
async fn a_server_restart_loses_nothing() {
    let mut server = LocalServer::start("default", "");
    let settings = vec![
        ("retries".to_string(), "1".to_string()),
        ("retry_backoff_seconds".to_string(), "0.05".to_string()),
    ];
    let mut b = runtime().open(&server.uri(), settings).await.expect("open");
    for i in 0..20 {
        b.update(&State::partial(
            "run",
            format!(r#"{{"singer_state":{{"k{i}":{i}}}}}"#),
        ))
        .await
        .expect("update before the restart");
    }
    b.set(&State::completed(
        "other",
        r#"{"singer_state":{"kept":true}}"#,
    ))
    .await
    .unwrap();

    // Killed, not stopped: a write acknowledged before it was durable would be gone.
    server.kill();
    for _ in 0..3 {
        match b
            .update(&State::partial("run", r#"{"singer_state":{"down":1}}"#))
            .await
        {
            Err(Error::Unreachable(m)) => {
                assert!(m.contains(&format!("127.0.0.1:{}", server.port)), "{m}")
            }
            other => panic!("expected unreachable while the server is down, got {other:?}"),
        }
        assert!(matches!(b.get("run").await, Err(Error::Unreachable(_))));
    }

    server.resume();
    // the same instance goes on, and every acknowledged write is there
    let state = b
        .get("run")
        .await
        .expect("get after the restart")
        .expect("state kept");
    let bookmarks = json(&state.partial)["singer_state"]
        .as_object()
        .cloned()
        .unwrap();
    for i in 0..20 {
        assert_eq!(bookmarks[&format!("k{i}")], i, "k{i} lost");
    }
    assert!(
        !bookmarks.contains_key("down"),
        "a failed update was not applied"
    );
    assert_eq!(
        json(&b.get("other").await.unwrap().unwrap().completed)["singer_state"]["kept"],
        true
    );
    b.update(&State::partial("run", r#"{"singer_state":{"after":1}}"#))
        .await
        .expect("update after the restart");
    assert_eq!(
        json(&b.get("run").await.unwrap().unwrap().partial)["singer_state"]["after"],
        1
    );
}
