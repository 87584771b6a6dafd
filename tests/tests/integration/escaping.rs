//! Property test: arbitrary strings survive the trip through query parameters (state ids) and
//! JSON bodies (state content) to ClickHouse and back.

use integration_tests::state_host::State;
use integration_tests::{TestTable, json};
use proptest::prelude::*;

fn arbitrary_text() -> impl Strategy<Value = String> {
    // Everything but NUL-free control noise: quotes, backslashes, tabs, newlines, `\N`, unicode.
    proptest::collection::vec(
        prop_oneof![
            any::<char>().prop_filter("not NUL", |c| *c != '\0'),
            Just('\\'),
            Just('\''),
            Just('"'),
            Just('\t'),
            Just('\n'),
            Just('\r'),
            Just('%'),
            Just('_'),
            Just('{'),
            Just('}'),
            Just('N'),
        ],
        1..24,
    )
    .prop_map(|v| v.into_iter().collect())
}

#[test]
fn strings_round_trip_through_clickhouse() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let table = TestTable::new("escaping");
    let backend = std::cell::RefCell::new(runtime.block_on(table.open()));
    let mut config = ProptestConfig::with_cases(64);
    config.failure_persistence = None;
    proptest!(config, |(id in arbitrary_text(), value in arbitrary_text())| {
        let completed = serde_json::json!({"v": value}).to_string();
        let mut b = backend.borrow_mut();
        runtime.block_on(b.set(&State::completed(id.clone(), completed))).unwrap();
        let got = runtime.block_on(b.get(&id)).unwrap().expect("stored");
        prop_assert_eq!(&got.state_id, &id);
        let stored = json(&got.completed);
        prop_assert_eq!(stored["v"].as_str(), Some(value.as_str()));
        // the id as a literal pattern ([, * and ? escaped the fnmatch way) finds exactly it
        let literal: String = id
            .chars()
            .map(|c| match c {
                '[' | '*' | '?' => format!("[{c}]"),
                c => c.to_string(),
            })
            .collect();
        let ids = runtime.block_on(b.state_ids(Some(&literal))).unwrap();
        prop_assert_eq!(ids, vec![id.clone()]);
    });
}
