//! The settings every statement pins, so that no server default or settings profile changes
//! what it means: what an insert writes and whether it says so, what a read returns.
//!
//! A profile may set any setting's default for a user; a statement's own settings override it.
//! Those below would otherwise change a statement silently, without an error: a limit or
//! filter that truncates or filters a read (a deciding read that misses the lock's newest
//! generation), an overflow mode that turns a limit into a partial answer, a cache that answers
//! from before the last write, a view error acknowledged as a write, a bad row skipped. Each is
//! pinned to the value that makes the statement mean what it says, or fail: an overflow mode to
//! `throw`, so that a limit an operator set is kept and fails the statement loudly. A profile
//! that forbids the value (a constraint) makes the statement fail with `invalid-config`
//! (`http`), never run without it.
//!
//! The settings a deployment needs for consistency (`async_insert`, `insert_deduplicate`, the
//! quorum, sequential consistency) are `deployment::Consistency`'s; the ones a single statement
//! needs (`one_row_of_nothing`, `where_after_final`) are its own (`sql::query`). The list below
//! is written once: `Consistency::settings` sends it, the deployment check asks the server
//! which of the newer ones it knows, and `docs/deployments.md` lists it (a test holds the doc to
//! it).

use crate::role::Role;

/// Which statements a pin applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applies {
    /// Every statement.
    All,
    /// Statements that read: plain and deciding reads, and the guarded insert's `SELECT`.
    Reads,
    /// Reads that decide something, and the guarded insert.
    Deciding,
    /// Both kinds of insert.
    Inserts,
    /// Inserts whose rows a `SELECT` gives (`INSERT … SELECT … HAVING`).
    GuardedInserts,
    /// Inserts whose rows travel in the body (JSONEachRow).
    RowInserts,
}

impl Applies {
    fn covers(self, role: Role) -> bool {
        match self {
            Applies::All => true,
            Applies::Reads => matches!(role, Role::Read | Role::Deciding | Role::GuardedInsert),
            Applies::Deciding => matches!(role, Role::Deciding | Role::GuardedInsert),
            Applies::Inserts => matches!(role, Role::Insert | Role::GuardedInsert),
            Applies::GuardedInserts => role == Role::GuardedInsert,
            Applies::RowInserts => role == Role::Insert,
        }
    }

    /// As `docs/deployments.md` names the statements.
    pub fn described(self) -> &'static str {
        match self {
            Applies::All => "all",
            Applies::Reads => "reads",
            Applies::Deciding => "deciding reads, guarded inserts",
            Applies::Inserts => "inserts",
            Applies::GuardedInserts => "guarded inserts",
            Applies::RowInserts => "row inserts",
        }
    }
}

/// One pinned setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pin {
    pub name: &'static str,
    pub value: &'static str,
    pub applies: Applies,
    /// Newer than some supported server: sent only where `system.settings` lists it (an
    /// unknown setting fails the statement). The server version that added it, for the docs.
    pub since: Option<&'static str>,
}

const fn pin(name: &'static str, value: &'static str, applies: Applies) -> Pin {
    Pin {
        name,
        value,
        applies,
        since: None,
    }
}

const fn newer(
    name: &'static str,
    value: &'static str,
    applies: Applies,
    since: &'static str,
) -> Pin {
    Pin {
        name,
        value,
        applies,
        since: Some(since),
    }
}

/// Every pinned setting, with why.
pub const PINS: &[Pin] = &[
    // A read's answer, whole and unfiltered.
    pin("limit", "0", Applies::All),
    pin("offset", "0", Applies::All),
    pin("additional_table_filters", "{}", Applies::All),
    pin("additional_result_filter", "", Applies::All),
    pin("timeout_overflow_mode", "throw", Applies::All),
    pin("read_overflow_mode", "throw", Applies::Reads),
    pin("result_overflow_mode", "throw", Applies::Reads),
    pin("set_overflow_mode", "throw", Applies::Reads),
    pin("group_by_overflow_mode", "throw", Applies::Reads),
    pin("sort_overflow_mode", "throw", Applies::Reads),
    pin("distinct_overflow_mode", "throw", Applies::Reads),
    pin("transfer_overflow_mode", "throw", Applies::Reads),
    // `FINAL` where a statement says so, and nowhere else (settle's candidates share a key).
    pin("final", "0", Applies::Reads),
    pin(
        "do_not_merge_across_partitions_select_final",
        "0",
        Applies::Reads,
    ),
    // The history's version count is exact.
    pin("count_distinct_implementation", "uniqExact", Applies::Reads),
    // An answer computed now, not cached from before the last write.
    pin("use_query_cache", "0", Applies::Reads),
    newer("use_query_condition_cache", "0", Applies::Deciding, "25.3"),
    // Deleted rows (the lock log's pruned generations, withdrawn history rows) stay deleted.
    newer("apply_deleted_mask", "1", Applies::Reads, "23.10"),
    newer("apply_patch_parts", "1", Applies::Reads, "25.5"),
    newer("implicit_table_at_top_level", "", Applies::Reads, "25.5"),
    newer("run_query_in_background", "0", Applies::All, "26.8"),
    newer("filter", "", Applies::Reads, "26.8"),
    newer("select", "", Applies::Reads, "26.8"),
    newer("order", "", Applies::Reads, "26.8"),
    newer("sort", "", Applies::Reads, "26.8"),
    newer("page", "0", Applies::Reads, "26.8"),
    newer("format", "", Applies::All, "26.8"),
    newer("output_format", "", Applies::All, "26.8"),
    newer("input_format", "", Applies::All, "26.8"),
    // A write is acknowledged only with its view's part: an error in the view fails the insert.
    pin("materialized_views_ignore_errors", "0", Applies::Inserts),
    newer(
        "ignore_materialized_views_with_dropped_target_table",
        "0",
        Applies::Inserts,
        "24.1",
    ),
    // A retried guarded insert lands once.
    newer(
        "deduplicate_insert_select",
        "enable_when_possible",
        Applies::GuardedInserts,
        "25.12",
    ),
    // Every row sent is written as sent, or the insert fails.
    pin("input_format_allow_errors_num", "0", Applies::RowInserts),
    pin("input_format_allow_errors_ratio", "0", Applies::RowInserts),
];

/// The newer pins (those with a `since`), whose names the deployment check looks up.
pub fn newer_names() -> Vec<&'static str> {
    PINS.iter()
        .filter(|p| p.since.is_some())
        .map(|p| p.name)
        .collect()
}

/// The newer pins a server knows, as a bit per [`newer_names`] entry, from the names it listed.
pub fn known(names: &[String]) -> u64 {
    newer_names()
        .iter()
        .enumerate()
        .filter(|(_, name)| names.iter().any(|n| n == *name))
        .fold(0, |bits, (i, _)| bits | 1 << i)
}

/// The pins a statement of `role` carries, given the newer ones the server knows (`known`).
pub fn for_role(role: Role, known: u64) -> impl Iterator<Item = (&'static str, &'static str)> {
    let mut newer = 0;
    PINS.iter()
        .filter(move |p| {
            let sent = match p.since {
                None => true,
                Some(_) => {
                    let bit = 1u64 << newer;
                    newer += 1;
                    known & bit != 0
                }
            };
            sent && p.applies.covers(role)
        })
        .map(|p| (p.name, p.value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_setting_is_pinned_once_and_the_newer_fit_the_bits() {
        let mut names: Vec<&str> = PINS.iter().map(|p| p.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), PINS.len());
        assert!(newer_names().len() <= 64);
    }

    #[test]
    fn newer_pins_go_only_to_servers_that_know_them() {
        let none: Vec<_> = for_role(Role::Deciding, 0).map(|(n, _)| n).collect();
        assert!(none.contains(&"limit") && none.contains(&"use_query_cache"));
        assert!(!none.contains(&"use_query_condition_cache"));
        let all = known(
            &newer_names()
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>(),
        );
        let every: Vec<_> = for_role(Role::Deciding, all).map(|(n, _)| n).collect();
        assert!(every.contains(&"use_query_condition_cache"));
        let some = known(&["apply_deleted_mask".to_string(), "unknown".to_string()]);
        let read: Vec<_> = for_role(Role::Read, some).map(|(n, _)| n).collect();
        assert!(read.contains(&"apply_deleted_mask") && !read.contains(&"apply_patch_parts"));
    }

    #[test]
    fn each_role_gets_what_changes_its_meaning() {
        let all = u64::MAX;
        let of = |role| for_role(role, all).map(|(n, _)| n).collect::<Vec<_>>();
        assert!(of(Role::Insert).contains(&"materialized_views_ignore_errors"));
        assert!(of(Role::GuardedInsert).contains(&"materialized_views_ignore_errors"));
        assert!(of(Role::GuardedInsert).contains(&"read_overflow_mode"));
        assert!(of(Role::Insert).contains(&"input_format_allow_errors_num"));
        assert!(!of(Role::Read).contains(&"materialized_views_ignore_errors"));
        assert!(!of(Role::Mutation).contains(&"read_overflow_mode"));
        assert!(of(Role::Mutation).contains(&"limit"));
    }
}
