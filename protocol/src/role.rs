//! What a statement does, as far as what it must see and how it must land are concerned.

/// What a statement does, as far as what it must see and how it must land is concerned: each
/// deployment gives each role its settings ([`crate::deployment::Consistency::settings`]).
/// What a query does, as far as consistency goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    /// A read whose answer decides nothing (listing, counting, the schema check).
    #[default]
    Read,
    /// A read that decides something (who holds a lock, what to merge into): it must see every
    /// acknowledged write.
    Deciding,
    /// An INSERT: acknowledged only once stored where deciding reads see it, deduplicated by
    /// its token when retried.
    Insert,
    /// An `INSERT ... SELECT ... WHERE` whose condition reads what decides it (the lock log,
    /// the stored version): an insert and a deciding read at once.
    GuardedInsert,
    /// A DELETE (of the lock tables' rows).
    Mutation,
}
