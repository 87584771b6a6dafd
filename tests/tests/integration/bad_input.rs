//! The catalogue of bad input: each case gets a clear, typed error, and nothing is written.

use std::io::{Read, Write};

use integration_tests::state_host::{Error, State};
use integration_tests::{LocalServer, TestTable, json, runtime};

/// Rows in the state table and the lock log: nothing may be written by a refused call.
fn rows(table: &TestTable) -> (String, String) {
    let count = |t: String| {
        table
            .target
            .must(&format!("SELECT count() FROM {t}"))
            .trim()
            .to_string()
    };
    (
        count(table.qualified()),
        count(format!("{}_lock_log", table.qualified())),
    )
}

fn invalid_input<T: std::fmt::Debug>(result: Result<T, Error>, what: &str) -> String {
    match result {
        Err(Error::InvalidInput(m)) => m,
        other => panic!("{what}: expected invalid-input, got {other:?}"),
    }
}

#[tokio::test]
async fn json_that_is_invalid_or_not_an_object() {
    let table = TestTable::new("bad_json");
    let mut b = table.open().await;
    b.migrate().await.unwrap();
    for (text, needle) in [
        ("{\"a\":", "not valid JSON"),
        ("[1,2]", "an array"),
        ("42", "a number"),
        ("\"text\"", "a string"),
        ("null", "null"),
        ("", "not valid JSON"),
    ] {
        let m = invalid_input(b.set(&State::completed("s", text)).await, text);
        assert!(m.contains(needle), "{text}: {m}");
        invalid_input(b.update(&State::partial("s", text)).await, text);
        invalid_input(
            b.set_all(&[State::completed("ok", "{}"), State::partial("s", text)])
                .await,
            text,
        );
    }
    assert_eq!(rows(&table), ("0".into(), "0".into()));
}

#[tokio::test]
async fn a_16_mib_state_and_100000_levels_of_nesting() {
    let table = TestTable::new("bad_big");
    let mut b = table.open().await;
    b.migrate().await.unwrap();
    let big = format!("{{\"blob\":\"{}\"}}", "x".repeat(16 << 20));
    let m = invalid_input(b.set(&State::completed("big", big.clone())).await, "16 MiB");
    assert!(m.contains("at most"), "{m}");
    invalid_input(b.update(&State::partial("big", big)).await, "16 MiB update");
    let deep_array = "[".repeat(100_000) + &"]".repeat(100_000);
    let deep_object = "{\"a\":".repeat(100_000) + "1" + &"}".repeat(100_000);
    for deep in [deep_array, deep_object] {
        invalid_input(
            b.set(&State::completed("deep", deep.clone())).await,
            "deep set",
        );
        invalid_input(b.update(&State::partial("deep", deep)).await, "deep update");
    }
    // the instance is still healthy afterwards
    b.set(&State::completed("fine", "{}")).await.unwrap();
    assert_eq!(rows(&table).0, "1");
}

#[tokio::test]
async fn state_ids_empty_or_too_long() {
    let table = TestTable::new("bad_ids");
    let mut b = table.open().await;
    b.migrate().await.unwrap();
    let long = "x".repeat(10_000);
    for id in ["", long.as_str()] {
        invalid_input(b.set(&State::completed(id, "{}")).await, "set");
        invalid_input(b.update(&State::completed(id, "{}")).await, "update");
        invalid_input(b.get(id).await, "get");
        invalid_input(b.delete(id).await, "delete");
        invalid_input(b.acquire_lock(id).await, "lock");
    }
    assert_eq!(rows(&table), ("0".into(), "0".into()));
    // every ASCII punctuation character, control characters and unicode are fine
    let punctuation: String = (0x21u8..0x7f)
        .map(char::from)
        .filter(|c| c.is_ascii_punctuation())
        .collect();
    let control: String = (1u8..0x20).map(char::from).collect();
    for id in [punctuation.as_str(), control.as_str(), "ünïcødé ✓ 雪 🚀"] {
        b.set(&State::completed(id, r#"{"ok":1}"#)).await.unwrap();
        assert_eq!(b.get(id).await.unwrap().unwrap().state_id, id);
    }
}

#[tokio::test]
async fn malformed_patterns() {
    let table = TestTable::new("bad_patterns");
    let mut b = table.open().await;
    for pattern in ["[", "dev:[abc", "[!", "a[]"] {
        let m = invalid_input(b.state_ids(Some(pattern)).await, pattern);
        assert!(m.contains("unbalanced"), "{m}");
        invalid_input(b.get_all(Some(pattern)).await, pattern);
    }
}

/// A URI, settings over it, and what the error must mention.
type ConfigCase = (String, Vec<(&'static str, &'static str)>, &'static str);

#[tokio::test]
async fn bad_names_and_uris_are_invalid_config() {
    let table = TestTable::new("bad_config");
    let uri = table.target.uri();
    let cases: Vec<ConfigCase> = vec![
        (uri.clone(), vec![("table", "a`b")], "table name"),
        (uri.clone(), vec![("table", "a.b")], "table name"),
        (uri.clone(), vec![("table", "a b")], "table name"),
        (uri.clone(), vec![("table", "a'b")], "table name"),
        (uri.clone(), vec![("table", "a\"b")], "table name"),
        (
            uri.clone(),
            vec![("schema", "x`; DROP DATABASE y")],
            "schema name",
        ),
        ("clickhouse://user@:8123/db".into(), vec![], "host"),
        ("clickhouse://user@h:0/db".into(), vec![], "port"),
        ("clickhouse://user@h:70000/db".into(), vec![], "not valid"),
        ("ftp://user@h/db".into(), vec![], "unknown URI scheme 'ftp'"),
        ("clickhouse:/no-authority".into(), vec![], "scheme://"),
    ];
    for (uri, settings, needle) in cases {
        let settings = settings
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        match runtime().open(&uri, settings).await {
            Err(Error::InvalidConfig(m)) => assert!(m.contains(needle), "{uri}: {m}"),
            Err(other) => panic!("{uri}: expected invalid-config, got {other}"),
            Ok(_) => panic!("{uri}: accepted"),
        }
    }
}

#[tokio::test]
async fn a_password_with_uri_delimiters_works_on_a_server_that_has_it() {
    // A server of the test's own whose password really contains what a URI uses as delimiters.
    let password = "p@ss:w/o%rd#1?&=+ ü\\'\"";
    let server = LocalServer::start("meltano", password);
    let settings = vec![("table".to_string(), "pw_state".to_string())];
    // percent-encoded in the URI
    let mut b = runtime()
        .open(&server.uri(), settings.clone())
        .await
        .unwrap();
    b.set(&State::completed("id", r#"{"singer_state":{"by":"uri"}}"#))
        .await
        .expect("set with the password from the URI");
    // as a setting, exactly as it is, over a URI without one
    let no_password = format!("clickhouse://meltano@127.0.0.1:{}/default", server.port);
    let mut with_setting = settings.clone();
    with_setting.push(("password".to_string(), password.to_string()));
    let mut b = runtime().open(&no_password, with_setting).await.unwrap();
    let got = b
        .get("id")
        .await
        .expect("get with the password as a setting");
    assert_eq!(
        json(&got.expect("the state set above").completed)["singer_state"]["by"],
        "uri"
    );
    // and the same password with one character off is refused
    let mut wrong = settings;
    wrong.push(("password".to_string(), password.replace('#', "")));
    let mut b = runtime().open(&no_password, wrong).await.unwrap();
    assert!(matches!(b.get("id").await, Err(Error::Unauthorized(_))));
}

#[tokio::test]
async fn a_wrong_password_and_an_unknown_database() {
    let table = TestTable::new("bad_server");
    let mut b = runtime()
        .open(
            &table.target.uri_with_password("w@r:o/n%g#"),
            table.settings(),
        )
        .await
        .unwrap();
    assert!(matches!(b.get("x").await, Err(Error::Unauthorized(_))));
    let mut b = runtime()
        .open(
            &table.target.uri(),
            table.with(&[("database", "no_such_database_xyz")]),
        )
        .await
        .unwrap();
    match b.get("x").await {
        Err(Error::Server { code, name, .. }) => {
            assert_eq!((code, name.as_str()), (81, "UNKNOWN_DATABASE"))
        }
        other => panic!("expected UNKNOWN_DATABASE, got {other:?}"),
    }
}

/// An HTTP answer with a correct Content-Length.
fn http_answer(status: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// A server that answers every request with `answer`.
fn fake_server(answer: String) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut stream = stream;
            let mut buf = [0u8; 65536];
            let _ = stream.read(&mut buf);
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    port
}

#[tokio::test]
async fn a_server_that_answers_garbage_or_html() {
    let html = fake_server(http_answer(
        "200 OK",
        "<html><body>Welcome to nginx!</body></html>",
    ));
    let bad_gateway = fake_server(http_answer("502 Bad Gateway", "<h1>502 Bad Gateway</h1>"));
    let garbage = fake_server("\x00\x01garbage that is not HTTP at all\r\n\r\n".to_string());
    let open = |port: u16| async move {
        runtime()
            .open(
                &format!("clickhouse://default:@127.0.0.1:{port}/default"),
                vec![("retries".into(), "0".into())],
            )
            .await
            .unwrap()
    };
    let mut b = open(html).await;
    match b.get("x").await {
        Err(Error::Server { name, message, .. }) => {
            assert_eq!(name, "UNEXPECTED_RESPONSE", "{message}");
        }
        other => panic!("html: {other:?}"),
    }
    let mut b = open(bad_gateway).await;
    match b.get("x").await {
        Err(Error::Server { name, message, .. }) => {
            assert_eq!(name, "HTTP_502");
            assert!(message.contains("without a ClickHouse error"), "{message}");
        }
        other => panic!("502: {other:?}"),
    }
    let mut b = open(garbage).await;
    match b.get("x").await {
        Err(Error::Unreachable(m)) => {
            assert!(m.contains("not HTTP"), "{m}");
            assert!(
                !m.contains("backtrace") && !m.contains('\n'),
                "one line, no host internals: {m}"
            );
        }
        other => panic!("garbage: {other:?}"),
    }
}
