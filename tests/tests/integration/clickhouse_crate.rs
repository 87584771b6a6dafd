//! The official Rust client (the `clickhouse` crate) with its default features, against the
//! ClickHouse at `CLICKHOUSE_URL`: inserts in RowBinary sent as LZ4 blocks with CityHash128
//! checksums (`decompress=1`), selects answered in an LZ4 HTTP coding (`Accept-Encoding: lz4`)
//! and checked against the column types (RowBinaryWithNamesAndTypes), server-side parameters
//! sent as a multipart form, and errors.

use clickhouse::{Client, Compression, Row};
use integration_tests::Target;
use serde::{Deserialize, Serialize};

#[derive(Row, Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Event {
    id: u32,
    name: String,
    score: Option<i64>,
    tags: Vec<String>,
}

/// A database of the test's own, dropped at the end.
struct Database {
    target: Target,
    name: String,
}

impl Database {
    fn new() -> Database {
        let target = Target::from_env();
        let name = format!("crate_{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
        target.must(&format!("CREATE DATABASE {name}"));
        Database { target, name }
    }

    fn client(&self) -> Client {
        Client::default()
            .with_url(self.target.base_url())
            .with_user(&self.target.user)
            .with_password(&self.target.password)
            .with_database(&self.name)
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let _ = self
            .target
            .query(&format!("DROP DATABASE IF EXISTS {}", self.name));
    }
}

fn event(id: u32) -> Event {
    Event {
        id,
        name: format!("événement {id}\t'quoted' \\ \n✓"),
        score: id.is_multiple_of(3).then(|| -i64::from(id)),
        tags: vec![id.to_string(), String::new()],
    }
}

#[tokio::test]
async fn insert_and_fetch_with_default_features() {
    // The defaults this test is about: LZ4 blocks one way, LZ4 coding the other.
    assert!(matches!(Compression::default(), Compression::Lz4));
    let db = Database::new();
    let client = db.client();
    client
        .query(
            "CREATE TABLE events (id UInt32, name String, score Nullable(Int64), tags Array(String)) \
             ENGINE = MergeTree ORDER BY id",
        )
        .execute()
        .await
        .expect("create");

    // Enough rows for several compressed blocks.
    let events: Vec<Event> = (0..20_000).map(event).collect();
    let mut insert = client.insert::<Event>("events").await.expect("insert");
    for e in &events {
        insert.write(e).await.expect("write");
    }
    insert.end().await.expect("end");

    let count: u64 = client
        .query("SELECT count() FROM events")
        .fetch_one()
        .await
        .expect("count");
    assert_eq!(count, 20_000);

    // Server-side parameters (a multipart form) and a client-side bind.
    let tail: Vec<Event> = client
        .query("SELECT ?fields FROM events WHERE id >= {lo:UInt32} AND name LIKE ? ORDER BY id")
        .bind("événement%")
        .param("lo", 19_990u32)
        .fetch_all()
        .await
        .expect("fetch");
    assert_eq!(tail, events[19_990..].to_vec());

    // A large answer, compressed by the server.
    let all: Vec<Event> = client
        .query("SELECT ?fields FROM events ORDER BY id")
        .fetch_all()
        .await
        .expect("fetch all");
    assert_eq!(all, events);
}

#[tokio::test]
async fn server_errors_reach_the_client() {
    let db = Database::new();
    let client = db.client();
    match client
        .query("SELECT id FROM no_such_table")
        .fetch_all::<u32>()
        .await
    {
        Err(clickhouse::error::Error::BadResponse(message)) => {
            assert!(message.contains("UNKNOWN_TABLE"), "{message}")
        }
        other => panic!("expected a bad response, got {other:?}"),
    }
    // A row that does not fit the table's columns: refused before anything is written.
    client
        .query("CREATE TABLE narrow (id UInt8) ENGINE = MergeTree ORDER BY id")
        .execute()
        .await
        .expect("create");
    assert!(client.insert::<Event>("narrow").await.is_err());
    let count: u64 = client
        .query("SELECT count() FROM narrow")
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(count, 0);
}
