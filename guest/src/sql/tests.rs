//! The statements' unit tests.

use super::guard::guard_condition;
use super::*;
use crate::glob::Filter;
use protocol::guard::Guard;
use protocol::role::Role;

fn origin() -> Origin<'static> {
    Origin {
        op: Op::Update,
        writer: "w",
        lock_owner: "o",
        token: 2,
    }
}

fn guard() -> Guard {
    Guard {
        state_id: "a".into(),
        generation: 2,
        owner: "me".into(),
        confirmed: true,
        previous_until: 1,
        expected_version: 0,
    }
}

fn statements() -> Statements {
    let config = Config::parse(
        "clickhouse://u@h/db",
        &[("table".into(), "my_state".into())],
    )
    .expect("valid");
    Statements::new(&config)
}

/// Every read that decides something is sent as deciding, so that a cluster or Cloud gives it
/// the settings that make it see every acknowledged write (one server ignores them, so no
/// integration test here would notice one missing); every write is sent as what it is.
#[test]
fn each_statement_is_sent_in_its_consistency_role() {
    let s = statements();
    let row = StateRow {
        state_id: "a",
        partial: "{}",
        completed: "{}",
        version_ms: 1,
    };
    let guard = Guard {
        state_id: "a".into(),
        generation: 2,
        owner: "me".into(),
        confirmed: false,
        previous_until: 1,
        expected_version: 0,
    };
    let origin = origin();
    let deciding = [
        ("get", s.get("a").query),
        ("version_of", s.version_of("a")),
        ("versions", s.versions().query),
        ("guard_holds", s.guard_holds(&guard)),
        ("log_state", s.log_state("a").query),
        ("log_outlook", s.log_outlook("a").query),
        ("log_claims", s.log_claims("a", 2, false).query),
        ("log_claims with state", s.log_claims("a", 2, true).query),
        ("lock_candidates", s.lock_candidates("a", 0).query),
        ("history", s.history("a", 1).expect("on").query),
        (
            "history_at",
            s.history_at("a", Point::Version(1)).expect("on").query,
        ),
        ("history_extent", s.history_extent("a").expect("on").query),
    ];
    for (name, query) in deciding {
        assert_eq!(query.role, Role::Deciding, "{name}");
    }
    let guarded = [
        ("write_guarded", s.write_guarded(row, &origin, &guard, "t")),
        ("set_unless_newer", s.set_unless_newer(row, &origin, "t")),
    ];
    for (name, query) in guarded {
        assert_eq!(query.role, Role::GuardedInsert, "{name}");
    }
    // The guard is the condition of the write and of its read-only twin, over the log.
    let (condition, _) = guard_condition(&s, &guard);
    let write = s.write_guarded(row, &origin, &guard, "t").sql;
    assert!(write.starts_with("INSERT INTO"), "{write}");
    assert!(write.ends_with(&format!("HAVING {condition}")), "{write}");
    let holds = s.guard_holds(&guard).sql;
    assert!(
        holds.starts_with(&format!("SELECT toUInt8({condition})")),
        "{holds}"
    );
    let inserts = [
        ("insert_states", s.insert_states(b"{}".to_vec(), "t")),
        ("log_insert", s.log_insert(b"{}".to_vec(), "t")),
        ("lock_insert", s.lock_insert(b"{}".to_vec(), "t")),
    ];
    for (name, query) in inserts {
        assert_eq!(query.role, Role::Insert, "{name}");
    }
}

#[test]
fn identifiers_are_quoted() {
    assert_eq!(quote_identifier("state"), "`state`");
    assert_eq!(quote_identifier("a`b\\c"), "`a\\`b\\\\c`");
    let s = statements();
    assert!(s.create_state_table().sql.contains("`meltano`.`my_state`"));
    assert!(
        s.create_lock_table()
            .sql
            .contains("`meltano`.`my_state_lock`")
    );
}

#[test]
fn the_schema_per_deployment_kind() {
    // One server and ClickHouse Cloud: the original backend's DDL (Cloud makes it Shared).
    let single: Vec<String> = statements()
        .migration()
        .into_iter()
        .map(|q| q.sql)
        .collect();
    assert_eq!(single.len(), 8);
    assert!(
        single
            .iter()
            .all(|s| !s.contains("ON CLUSTER") && !s.contains("Replicated"))
    );
    assert!(single[1].contains("ENGINE = ReplacingMergeTree(updated_at) ORDER BY state_id"));
    assert!(single[3].contains("non_replicated_deduplication_window"));
    // An older lock log gains the events it lacks (`Session::migrate`, when it lacks them).
    let events = "event Enum8('acquire' = 1, 'renew' = 2, 'release' = 3, 'force' = 4, 'want' = 5)";
    assert!(
        statements()
            .lock_log_events()
            .sql
            .ends_with(&format!("MODIFY COLUMN {events}"))
    );
    assert!(single[3].contains(events));
    // A self-managed cluster: ON CLUSTER, Replicated engines on one Keeper path per table.
    let config = Config::parse(
        "clickhouse://u@h/db",
        &[("cluster".to_string(), "prod".to_string())],
    )
    .unwrap();
    let cluster: Vec<String> = Statements::new(&config)
        .migration()
        .into_iter()
        .map(|q| q.sql)
        .collect();
    assert_eq!(
        cluster[0],
        "CREATE DATABASE IF NOT EXISTS `meltano` ON CLUSTER `prod`"
    );
    assert!(
        cluster
            .iter()
            .all(|s| s.contains(" ON CLUSTER `prod` ") || s.ends_with(" ON CLUSTER `prod`"))
    );
    assert!(cluster[1].contains(
        "ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}', updated_at)"
    ));
    assert!(cluster[2].contains(
        "ReplicatedReplacingMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}', locked_at)"
    ));
    assert!(cluster[3].contains(
        "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}') ORDER BY"
    ));
    assert!(!cluster[3].contains("non_replicated_deduplication_window"));
    assert!(cluster[4].contains(
        "ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}', updated_at) ORDER BY (state_id, slot)"
    ));
    assert!(cluster[5].starts_with("CREATE MATERIALIZED VIEW IF NOT EXISTS"));
    assert!(
        cluster[6]
            .starts_with("ALTER TABLE `meltano`.`state_history` ON CLUSTER `prod` MODIFY TTL")
    );
    // Who wrote: one row per writer, kept as long as the history keeps its rows.
    assert!(single[7].starts_with("CREATE TABLE IF NOT EXISTS `meltano`.`my_state_writers` ("));
    assert!(
        single[7].ends_with(
            "ENGINE = ReplacingMergeTree ORDER BY writer \
             TTL toDateTime(intDiv(at_ms, 1000)) + INTERVAL 90 DAY"
        ),
        "{}",
        single[7]
    );
    assert!(cluster[7].contains(
        "ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}') ORDER BY writer"
    ));
}

/// With the history on, every state write goes to the history, names who wrote it, and counts
/// each row twice (the history's and the view's); with it off, the writes are the original
/// backend's, to the state table, and nothing of the history is created.
#[test]
fn state_writes_go_through_the_history_when_it_is_on() {
    let on = statements();
    let row = StateRow {
        state_id: "a",
        partial: "{}",
        completed: "{}",
        version_ms: 1,
    };
    let writes = [
        on.insert_states(b"{}".to_vec(), "t"),
        on.set_unless_newer(row, &origin(), "t"),
        on.write_guarded(row, &origin(), &guard(), "t"),
    ];
    for q in &writes {
        assert!(
            q.sql
                .starts_with("INSERT INTO `meltano`.`my_state_history` ("),
            "{}",
            q.sql
        );
        assert!(
            q.sql
                .contains(", op, writer, lock_owner, token, seq, slot)"),
            "{}",
            q.sql
        );
        assert_eq!(q.fanout, 2);
        assert!(q.settings.contains(&(
            "deduplicate_blocks_in_dependent_materialized_views",
            "1".into()
        )));
    }
    for guarded in [
        on.set_unless_newer(row, &origin(), "t"),
        on.write_guarded(row, &origin(), &guard(), "t"),
    ] {
        for (name, value) in [
            ("op", "update"),
            ("writer", "w"),
            ("lock_owner", "o"),
            ("token", "2"),
        ] {
            assert!(guarded.params.contains(&(name, value.into())), "{name}");
        }
    }
    let schema: Vec<String> = on.migration().into_iter().map(|q| q.sql).collect();
    assert!(schema[4].contains(
        "op Enum8('set' = 1, 'update' = 2, 'delete' = 3, 'clear' = 4, 'set-all' = 5, \
         'clear-all' = 6, 'restore' = 7, 'clear-stream' = 8)"
    ));
    assert!(schema[4].contains("TTL toDateTime(updated_at) + INTERVAL 90 DAY"));
    assert_eq!(
        schema[5],
        "CREATE MATERIALIZED VIEW IF NOT EXISTS `meltano`.`my_state_history_to_state` TO \
         `meltano`.`my_state` AS SELECT state_id, partial_state, completed_state, updated_at \
         FROM `meltano`.`my_state_history`"
    );

    let config = Config::parse(
        "clickhouse://u@h/db",
        &[
            ("table".into(), "my_state".into()),
            ("history".into(), "false".into()),
        ],
    )
    .expect("valid");
    let off = Statements::new(&config);
    for q in [
        off.insert_states(b"{}".to_vec(), "t"),
        off.set_unless_newer(row, &origin(), "t"),
    ] {
        assert!(q.sql.starts_with("INSERT INTO `meltano`.`my_state` (state_id, partial_state, completed_state, updated_at) "), "{}", q.sql);
        assert_eq!(q.fanout, 1);
        assert!(!q.params.iter().any(|(name, _)| *name == "op"));
    }
    // Off: the original's three tables, the lock log and who wrote (for the lock's holder).
    assert_eq!(off.migration().len(), 5);
    assert_eq!(on.migration().len(), 8);
    assert!(off.history("a", 1).is_none());
    let mut data = Vec::new();
    off.encode_state(row, &origin(), 0, &mut data)
        .expect("encoded");
    assert!(!String::from_utf8_lossy(&data).contains("\"op\""));
    data.clear();
    on.encode_state(row, &origin(), 0, &mut data)
        .expect("encoded");
    assert_eq!(
        String::from_utf8_lossy(&data),
        "{\"state_id\":\"a\",\"partial_state\":\"{}\",\"completed_state\":\"{}\",\
         \"updated_at\":\"0.001\",\"op\":\"update\",\"writer\":\"w\",\"lock_owner\":\"o\",\
         \"token\":2,\"seq\":0,\"slot\":1}\n"
    );
}

/// With no count, a row's slot is its version and no ordinal is read; with a count, a write
/// reads its ordinal in the same statement and takes the slot modulo the count, and a JSON
/// insert's rows take theirs from `history_seqs`.
#[test]
fn a_count_per_id_keeps_versions_by_slot() {
    let row = StateRow {
        state_id: "a",
        partial: "{}",
        completed: "{}",
        version_ms: 1234,
    };
    let off = statements();
    let guarded = off.set_unless_newer(row, &origin(), "t").sql;
    assert!(guarded.contains(", 0, {version:UInt64} FROM"), "{guarded}");
    assert!(!guarded.contains("max(seq)"), "{guarded}");
    assert!(off.history_seqs(&["a"]).is_none());
    // Reads merge slots (FINAL) only where merges replace versions: with a count.
    let read = |s: &Statements| s.history("a", 1).expect("on").query.sql;
    assert!(!read(&off).contains("FINAL"), "{}", read(&off));

    let config = Config::parse(
        "clickhouse://u@h/db",
        &[
            ("table".into(), "my_state".into()),
            ("history_versions".into(), "3".into()),
        ],
    )
    .expect("valid");
    let on = Statements::new(&config);
    let next =
        "(SELECT max(seq) + 1 FROM `meltano`.`my_state_history` WHERE state_id = {id:String})";
    for sql in [
        on.set_unless_newer(row, &origin(), "t").sql,
        on.write_guarded(row, &origin(), &guard(), "t").sql,
    ] {
        assert!(sql.contains(&format!(", {next}, {next} % 3 FROM")), "{sql}");
    }
    let seqs = on.history_seqs(&["a", "it's\\"]).expect("a count").query;
    assert!(
        seqs.sql
            .contains("JSONExtract({ids:String}, 'Array(String)')"),
        "{}",
        seqs.sql
    );
    assert_eq!(seqs.params, vec![("ids", r#"["a","it's\\"]"#.to_string())]);
    let mut data = Vec::new();
    on.encode_state(row, &origin(), 7, &mut data)
        .expect("encoded");
    assert!(
        String::from_utf8_lossy(&data).ends_with(",\"seq\":7,\"slot\":1}\n"),
        "{}",
        String::from_utf8_lossy(&data)
    );
    assert!(read(&on).contains("FINAL"), "{}", read(&on));
    let table = &on.migration()[4].sql;
    assert!(
        table.contains("ENGINE = ReplacingMergeTree(updated_at) ORDER BY (state_id, slot)"),
        "{table}"
    );
    assert!(!table.contains("PARTITION BY"), "{table}");
}

/// Keeping the history for ever leaves the table without a TTL.
#[test]
fn history_days_zero_keeps_every_version() {
    let config = Config::parse(
        "clickhouse://u@h/db",
        &[("history_days".into(), "0".into())],
    )
    .expect("valid");
    let table = Statements::new(&config)
        .create_history_table()
        .expect("on")
        .sql;
    assert!(!table.contains("TTL"), "{table}");
    assert!(Statements::new(&config).alter_history_ttl().is_none());
}

#[test]
fn params_are_tsv_escaped() {
    assert_eq!(escape_param("a\\b\tc\nd'e\"f"), "a\\\\b\\tc\\nd'e\"f");
    assert_eq!(escape_param("\\N"), "\\\\N");
    assert_eq!(escape_param("✓"), "✓");
}

#[test]
fn values_are_bound_not_spliced() {
    let s = statements();
    let id = "x' OR 1=1 --";
    for q in [s.get(id).query, s.version_of(id), s.lock_delete(id, id)] {
        assert!(!q.sql.contains(id), "{}", q.sql);
        assert!(q.params.iter().any(|(_, v)| v == id));
    }
    let q = s.state_ids(&Filter::Exact(id.into())).query;
    assert!(!q.sql.contains(id));
    assert_eq!(q.params, vec![("pattern", id.to_string())]);
}

#[test]
fn filters_become_conditions() {
    let s = statements();
    let all = s.state_ids(&Filter::All).query.sql;
    assert!(
        all.contains(&format!("FINAL WHERE {LIVE} ORDER BY")),
        "{all}"
    );
    let exact = s.state_ids(&Filter::Exact("dev:x".into())).query;
    assert!(exact.sql.starts_with("SELECT"), "{}", exact.sql);
    assert!(exact.sql.contains("WHERE state_id = {pattern:String}"));
    let q = s
        .get_all(&Filter::Match {
            prefix: "dev:".into(),
            regex: "(?s)^dev:.*$".into(),
        })
        .query;
    assert!(
        q.sql
            .contains("startsWith(state_id, {prefix:String}) AND match(state_id, {regex:String})")
    );
    let q = s
        .get_all(&Filter::Match {
            prefix: String::new(),
            regex: "(?s)^.*x$".into(),
        })
        .query;
    assert!(!q.sql.contains("startsWith"));
}

#[test]
fn writes_are_synchronous_and_tokened() {
    let s = statements();
    let q = s.insert_states(b"{}\n".to_vec(), "tok-1");
    // synchronous and deduplicated by the deployment's settings for inserts
    assert_eq!(q.role, Role::Insert);
    assert!(
        q.settings
            .contains(&("insert_deduplication_token", "tok-1".into()))
    );
    assert_eq!(q.data.as_deref().map(Vec::as_slice), Some(&b"{}\n"[..]));
}
