//! Background merges of the tables' parts.

use crate::*;

impl LockModel {
    /// A background merge of the parts on `replica` (every replica with quorum). The state table
    /// is a ReplacingMergeTree(updated_at) by state id: the merge keeps the highest version, the
    /// last inserted of equals, which is what `FINAL` reads. Settle mode's candidates table is a
    /// ReplacingMergeTree(locked_at) by state id too: the merge keeps one candidate. The lock
    /// log is a plain MergeTree (merges keep every row) and is not touched. Returns whether
    /// anything merged.
    pub(crate) fn merge(&self, world: &mut World, replica: u8) -> bool {
        let mask = if self.quorum() {
            (1 << self.replicas) - 1
        } else {
            1 << replica
        };
        let mergeable = |row: &Row| match self.protocol {
            Protocol::Fenced => matches!(row, Row::State { .. }),
            Protocol::Settle => matches!(row, Row::Candidate { .. }),
        };
        let parts: Vec<usize> = (0..world.rows.len())
            .filter(|&i| world.rows[i].replicas & mask == mask && mergeable(&world.rows[i].row))
            .collect();
        if parts.len() < 2 {
            return false;
        }
        // the highest version (locked_at for candidates), the last inserted of equals
        let key = |row: &Row| match row {
            Row::State { version, .. } => *version,
            Row::Candidate { locked_at, .. } => *locked_at,
            Row::Log { .. } => 0,
        };
        let mut kept = parts[0];
        for &i in &parts[1..] {
            if key(&world.rows[i].row) >= key(&world.rows[kept].row) {
                kept = i;
            }
        }
        let survivor = world.rows[kept].row.clone();
        for &i in &parts {
            world.rows[i].replicas &= !mask;
        }
        world.rows.retain(|r| r.replicas != 0);
        world.rows.push(Landed {
            row: survivor,
            replicas: mask,
        });
        true
    }
}
