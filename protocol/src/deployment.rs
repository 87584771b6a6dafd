//! Where the tables live, and whether that is safe: one server, ClickHouse Cloud, or a
//! self-managed replicated cluster.
//!
//! The danger is a silent split. A plain (Replacing)MergeTree created on one replica of a
//! cluster behind a load balancer exists on that replica only; another replica either has no
//! such table or a table of its own, so state appears and vanishes with the balancer and the
//! lock excludes nothing. So at first use the store looks at what its tables are
//! (`system.tables`) and what the server is (`system.macros`, `system.clusters`), and refuses a
//! plain table on a server configured as a replica unless told it is fine.
//!
//! Pure decisions on what the server reported; `Store` runs the query.

use crate::config::Config;
use crate::error::{Error, Result};
use crate::role::Role;
use crate::rows::Observation;

/// What kind of deployment the tables are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The tables do not exist yet (they are created on first use).
    Missing,
    /// Plain MergeTree-family tables on a server that is not configured as a replica.
    SingleServer,
    /// SharedMergeTree-family tables: ClickHouse Cloud.
    Cloud,
    /// ReplicatedMergeTree-family tables on a self-managed cluster.
    Replicated,
    /// Not known: the user may not read the system tables. Inserts then carry the quorum
    /// settings, the safe side: they make a Replicated table's inserts visible to every deciding
    /// read, and a plain or Shared table ignores them.
    Unknown,
}

/// The settings each role of query carries on a deployment, so that every deciding read sees
/// every acknowledged write, and a retried insert lands once:
///
/// | kind | inserts | deciding reads |
/// |---|---|---|
/// | one server | synchronous, deduplicated | (sequential consistency: no effect) |
/// | ClickHouse Cloud | synchronous, deduplicated | sequential consistency: the replica refreshes its parts from Keeper first |
/// | replicated cluster | synchronous, deduplicated, quorum of a majority, quorum inserts linearized | sequential consistency: reads see every quorum insert, or fail (retried) |
///
/// Deletes wait for every replica everywhere. Every setting is sent with each query, so a
/// server's or profile's defaults (such as `async_insert = 1`, the default since 26.3) change
/// nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Consistency {
    pub kind: Kind,
    /// Send `deduplicate_insert` too (only where the server knows it: an unknown setting is an
    /// error).
    pub deduplicate_insert: bool,
    /// The newer pinned settings the server knows (`pinned::known`): sent with the rest.
    pub pinnable: u64,
}

impl Consistency {
    /// Before the tables are seen: what the configuration says they will be.
    pub fn assumed(config: &Config) -> Self {
        Consistency {
            kind: if config.cluster.is_some() {
                Kind::Replicated
            } else {
                Kind::SingleServer
            },
            deduplicate_insert: false,
            pinnable: 0,
        }
    }

    /// When the deployment check was denied (see [`Kind::Unknown`]).
    pub fn unknown() -> Self {
        Consistency {
            kind: Kind::Unknown,
            deduplicate_insert: false,
            pinnable: 0,
        }
    }

    /// After the deployment check: what the tables are (or will be, when missing).
    pub fn observed(config: &Config, kind: Kind, observed: &Observation) -> Self {
        Consistency {
            kind: match kind {
                Kind::Missing => Consistency::assumed(config).kind,
                kind => kind,
            },
            deduplicate_insert: observed.dedup_setting != 0,
            pinnable: crate::pinned::known(&observed.pinnable),
        }
    }

    /// The settings a statement of `role` carries: this deployment's, then the pinned ones
    /// (`pinned`).
    pub fn settings(&self, role: Role) -> Vec<(&'static str, &'static str)> {
        let mut settings = self.consistency(role);
        settings.extend(crate::pinned::for_role(role, self.pinnable));
        settings
    }

    fn consistency(&self, role: Role) -> Vec<(&'static str, &'static str)> {
        match role {
            Role::Read | Role::Mutation => vec![],
            Role::Deciding => vec![("select_sequential_consistency", "1")],
            Role::Insert | Role::GuardedInsert => {
                let mut settings = vec![("async_insert", "0"), ("insert_deduplicate", "1")];
                if role == Role::GuardedInsert {
                    // Its WHERE decides whether it writes: a deciding read.
                    settings.push(("select_sequential_consistency", "1"));
                }
                if self.deduplicate_insert {
                    settings.push(("deduplicate_insert", "enable"));
                }
                if matches!(self.kind, Kind::Replicated | Kind::Unknown) {
                    // Acknowledged once a majority of replicas hold the block, and linearized,
                    // which is what `select_sequential_consistency` needs to see it.
                    settings.push(("insert_quorum", "auto"));
                    settings.push(("insert_quorum_parallel", "0"));
                }
                settings
            }
        }
    }
}

/// The engine family, by the name `system.tables` gives.
fn family(engine: &str) -> Kind {
    if engine.starts_with("Shared") {
        Kind::Cloud
    } else if engine.starts_with("Replicated") {
        Kind::Replicated
    } else {
        Kind::SingleServer
    }
}

/// Decides whether this store may use its tables as they are.
pub fn check(config: &Config, observed: &Observation) -> Result<Kind> {
    if let Some(cluster) = &config.cluster
        && !observed.clusters.iter().any(|(name, _)| name == cluster)
    {
        let known: Vec<&str> = observed.clusters.iter().map(|(n, _)| n.as_str()).collect();
        return Err(Error::InvalidConfig(format!(
            "cluster '{cluster}' is not defined on the server (system.clusters has: {})",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        )));
    }
    let mut kinds = observed.tables.iter().map(|(_, engine)| family(engine));
    let Some(kind) = kinds.next() else {
        return Ok(Kind::Missing);
    };
    if let Some(other) = kinds.find(|k| *k != kind) {
        return Err(Error::InvalidConfig(format!(
            "the tables of {}.{} mix engine families ({}): {kind:?} and {other:?}; \
             recreate them alike (see `state-backend migrate --print`)",
            config.schema,
            config.table,
            describe(&observed.tables)
        )));
    }
    match kind {
        Kind::SingleServer if config.cluster.is_some() => Err(Error::InvalidConfig(format!(
            "the 'cluster' setting is '{}' but {}.{} are plain tables ({}) that live on one \
             replica only; create them ON CLUSTER with Replicated engines (see \
             `state-backend migrate --print`), or drop the setting on a single server",
            config.cluster.as_deref().unwrap_or_default(),
            config.schema,
            config.table,
            describe(&observed.tables)
        ))),
        Kind::SingleServer if observed.replica_macro != 0 => Err(Error::InvalidConfig(format!(
            "{}.{} are plain tables ({}) on a server set up as a replica (it has a 'replica' \
             macro): each replica behind a load balancer would keep its own state and its own \
             locks. Set the 'cluster' setting to the cluster's name ({}) and create the tables \
             ON CLUSTER with Replicated engines (`state-backend -s cluster=NAME migrate`, after \
             dropping the plain tables), or create them yourself (see `migrate --print`)",
            config.schema,
            config.table,
            describe(&observed.tables),
            cluster_names(observed)
        ))),
        kind => Ok(kind),
    }
}

fn describe(tables: &[(String, String)]) -> String {
    tables
        .iter()
        .map(|(name, engine)| format!("{name}: {engine}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn cluster_names(observed: &Observation) -> String {
    let replicated: Vec<&str> = observed
        .clusters
        .iter()
        .filter(|(_, replicas)| *replicas > 1)
        .map(|(name, _)| name.as_str())
        .collect();
    if replicated.is_empty() {
        "see system.clusters".to_string()
    } else {
        format!("with more than one replica here: {}", replicated.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(cluster: Option<&str>) -> Config {
        let mut settings = vec![];
        if let Some(c) = cluster {
            settings.push(("cluster".to_string(), c.to_string()));
        }
        Config::parse("clickhouse://u@h/db", &settings).expect("valid")
    }

    fn observed(engines: &[&str], replica_macro: bool, clusters: &[(&str, u64)]) -> Observation {
        let names = ["state", "state_lock", "state_lock_log"];
        Observation {
            tables: engines
                .iter()
                .zip(names)
                .map(|(e, n)| (n.to_string(), e.to_string()))
                .collect(),
            replica_macro: replica_macro as u8,
            clusters: clusters.iter().map(|(n, r)| (n.to_string(), *r)).collect(),
            dedup_setting: 0,
            history_view: 0,
            pinnable: vec![],
        }
    }

    fn refused(config: &Config, observed: &Observation) -> String {
        match check(config, observed) {
            Err(Error::InvalidConfig(m)) => m,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn kinds_by_engine() {
        let one = ["ReplacingMergeTree", "ReplacingMergeTree", "MergeTree"];
        assert_eq!(
            check(&config(None), &observed(&one, false, &[("default", 1)])).unwrap(),
            Kind::SingleServer
        );
        let cloud = [
            "SharedReplacingMergeTree",
            "SharedReplacingMergeTree",
            "SharedMergeTree",
        ];
        // Cloud servers have replicas and macros; the engine is what counts.
        assert_eq!(
            check(&config(None), &observed(&cloud, true, &[("default", 3)])).unwrap(),
            Kind::Cloud
        );
        let replicated = [
            "ReplicatedReplacingMergeTree",
            "ReplicatedReplacingMergeTree",
            "ReplicatedMergeTree",
        ];
        assert_eq!(
            check(
                &config(Some("c")),
                &observed(&replicated, true, &[("c", 2)])
            )
            .unwrap(),
            Kind::Replicated
        );
        // tables an operator created Replicated are fine without the setting too
        assert_eq!(
            check(&config(None), &observed(&replicated, true, &[("c", 2)])).unwrap(),
            Kind::Replicated
        );
        assert_eq!(
            check(&config(None), &observed(&[], true, &[("c", 2)])).unwrap(),
            Kind::Missing
        );
    }

    #[test]
    fn a_plain_table_on_a_replica_is_refused_naming_the_fix() {
        let plain = ["ReplacingMergeTree", "ReplacingMergeTree", "MergeTree"];
        let m = refused(
            &config(None),
            &observed(&plain, true, &[("default", 1), ("two_replicas", 2)]),
        );
        assert!(m.contains("'cluster' setting"), "{m}");
        assert!(m.contains("two_replicas"), "{m}");
        assert!(
            !m.contains("default"),
            "only clusters with replicas are named: {m}"
        );
        assert!(m.contains("state: ReplacingMergeTree"), "{m}");
        // with the setting, plain tables are refused too, macro or not: they were made before
        // it, and each replica would keep its own
        for replica_macro in [true, false] {
            let m = refused(
                &config(Some("c")),
                &observed(&plain, replica_macro, &[("c", 2)]),
            );
            assert!(m.contains("plain tables"), "{m}");
        }
    }

    #[test]
    fn an_unknown_cluster_or_mixed_engines_are_refused() {
        let m = refused(&config(Some("nope")), &observed(&[], false, &[("a", 1)]));
        assert!(
            m.contains("cluster 'nope' is not defined") && m.contains("has: a"),
            "{m}"
        );
        let mixed = ["ReplicatedReplacingMergeTree", "ReplacingMergeTree"];
        let m = refused(&config(None), &observed(&mixed, false, &[]));
        assert!(m.contains("mix engine families"), "{m}");
    }

    #[test]
    fn inserts_ask_for_what_each_kind_needs_and_deciding_reads_are_consistent() {
        let settings = |kind, dedup, role| {
            Consistency {
                kind,
                deduplicate_insert: dedup,
                pinnable: 0,
            }
            .consistency(role)
        };
        for kind in [
            Kind::SingleServer,
            Kind::Cloud,
            Kind::Replicated,
            Kind::Unknown,
        ] {
            let insert = settings(kind, false, Role::Insert);
            assert!(insert.contains(&("async_insert", "0")), "{kind:?}");
            assert!(insert.contains(&("insert_deduplicate", "1")), "{kind:?}");
            assert!(!insert.iter().any(|(n, _)| *n == "deduplicate_insert"));
            let insert = settings(kind, true, Role::Insert);
            assert!(
                insert.contains(&("deduplicate_insert", "enable")),
                "{kind:?}"
            );
            assert_eq!(
                settings(kind, false, Role::Deciding),
                vec![("select_sequential_consistency", "1")]
            );
            assert!(settings(kind, true, Role::Read).is_empty());
            let quorum = insert.contains(&("insert_quorum", "auto"))
                && insert.contains(&("insert_quorum_parallel", "0"));
            // sequential consistency covers only linearized quorum inserts on Replicated
            // tables; Cloud and one server need no quorum; unknown tables may be Replicated
            assert_eq!(
                quorum,
                matches!(kind, Kind::Replicated | Kind::Unknown),
                "{kind:?}"
            );
        }
    }

    #[test]
    fn before_the_tables_are_seen_the_configuration_decides() {
        assert_eq!(Consistency::assumed(&config(None)).kind, Kind::SingleServer);
        assert_eq!(
            Consistency::assumed(&config(Some("c"))).kind,
            Kind::Replicated
        );
        let seen = observed(&[], true, &[("c", 2)]);
        let c = Consistency::observed(&config(Some("c")), Kind::Missing, &seen);
        assert_eq!(c.kind, Kind::Replicated);
        // operator-made Replicated tables count without the setting
        let c = Consistency::observed(&config(None), Kind::Replicated, &seen);
        assert_eq!(c.kind, Kind::Replicated);
    }

    /// `deduplicate_insert` is sent only to a server that knows it: an unknown setting fails
    /// every insert.
    #[test]
    fn deduplicate_insert_is_sent_where_the_server_has_it() {
        for known in [0, 1] {
            let seen = Observation {
                dedup_setting: known,
                ..observed(&["MergeTree"], false, &[])
            };
            let c = Consistency::observed(&config(None), Kind::SingleServer, &seen);
            assert_eq!(c.deduplicate_insert, known == 1);
        }
    }
}
