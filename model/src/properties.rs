//! What the checks hold to: the properties' names, and which of them each check has.

use std::collections::BTreeSet;

use stateright::Property;

use crate::*;

/// The writes of at most one holder take effect per generation.
pub const ONE_HOLDER: &str = "the writes of at most one holder take effect per generation";
/// No acknowledged update is lost (but those of a grant an operator forced open).
pub const NOTHING_LOST: &str = "no acknowledged update is lost";
/// A state row of an older generation never has a version at or above one of a newer one.
pub const FENCED: &str = "a fenced write never overwrites newer state";
/// Settle mode: never two clients in their critical sections at once.
pub const EXCLUSIVE: &str = "at most one holder at a time";
/// One client alone never finds the lock held.
pub const UNCONTENDED: &str = "an uncontended acquire succeeds";
/// An update whose guarded write was checked while an unlocked `set` was the stored state
/// merges into it.
pub const SET_KEPT: &str = "an update never writes over a set it could see";
/// A `set` lands at most once: a row of it landing again never shadows a write that knew of
/// its first landing (an update merged into it, a set sent after it).
pub const SET_ONCE: &str = "a set sent again never buries a write made after it landed";
/// Some `set` reports success (the set checks are not vacuous).
pub const SET_DONE: &str = "a set is reported done";
/// A `set` that reported success has landed.
pub const SET_LANDED: &str = "a set reported done has landed";
/// An update that starts after a holder was killed never fails with `locked` (with one other
/// client, the dead holder is the only one it can wait for): the dead grant's lease ends
/// within the update's timeout.
pub const NOT_LOCKED_OUT: &str = "a killed holder never locks out an update started after it";
/// Some update started after a kill is acknowledged.
pub const RECOVERS: &str = "an update after a kill is acknowledged";
/// Some update on an id its client found shared (`Memory::shared`) is acknowledged and gives
/// its grant back instead of keeping it: the rule that spares a second writer the linger is
/// explored (required in every check with two clients and two updates each).
pub const GIVES_BACK: &str = "an update on an id found shared gives its grant back";
/// Some update that resumed a kept grant another client had said it wants (a `want` row) is
/// acknowledged, written under that grant, and gives the grant back: the keeper heeds the
/// waiter instead of holding on for the linger (`fenced_with_a_waiter_wanting_a_kept_grant`).
pub const HEEDS_WANT: &str = "a kept grant another client wants is given back";
/// Some read sees a live grant that followed another's release (newest, within its lease,
/// neither released nor forced, nothing written under it anywhere) while the stored state is a
/// `set`'s above the grant's floor (so newer than anything its holder read). So the stored state
/// cannot tell that a grant is spent: a version past the floor need not be its holder's write,
/// and only the holder's `release` row ends a grant early. This is why a hand-off between two
/// writers costs four statements (read, claim, write, release) against a kept grant's one; see
/// docs/lock.md, "What a hand-off costs".
pub const SET_PASSES_A_LIVE_FLOOR: &str = "a set passes the floor of a grant not yet written under";
/// Some update is acknowledged (the bounds leave room for the protocol to finish).
pub const COMPLETES: &str = "an update is acknowledged";

impl LockModel {
    /// What every check of these bounds holds to (`Model::properties`).
    pub(crate) fn property_list(&self) -> Vec<Property<Self>> {
        let mut properties = match self.protocol {
            Protocol::Fenced => vec![
                Property::<Self>::always(ONE_HOLDER, |m, w| {
                    let mut owners = BTreeSet::new();
                    for r in &w.written {
                        if let Row::State {
                            generation,
                            owner,
                            client,
                            ..
                        } = r
                            && !m.is_setter(*client)
                        {
                            owners.insert((*generation, owner.clone()));
                        }
                    }
                    let generations: BTreeSet<u64> = owners.iter().map(|(g, _)| *g).collect();
                    generations.len() == owners.len()
                }),
                Property::<Self>::always(NOTHING_LOST, |m, w| {
                    // except the updates of a grant an operator forced open
                    let mut spared = 0u8;
                    for r in &w.written {
                        if let Row::State {
                            generation, client, ..
                        } = *r
                            && !m.is_setter(client)
                            && w.forced & (1 << generation) != 0
                        {
                            spared |= client_bits(client);
                        }
                    }
                    // ...and those a later `set` replaced.
                    let converged = w.converged_state().map_or(0, |s| s.updates);
                    w.acknowledged & !converged & !spared & !w.replaced & !SET_BITS == 0
                }),
                Property::<Self>::always(FENCED, |m, w| {
                    let states: Vec<(u64, u64)> = w
                        .written
                        .iter()
                        .filter_map(|r| match *r {
                            Row::State {
                                version,
                                generation,
                                client,
                                ..
                            } if !m.is_setter(client) => Some((generation, version)),
                            _ => None,
                        })
                        .collect();
                    states
                        .iter()
                        .all(|(ga, va)| states.iter().all(|(gb, vb)| !(ga < gb && va >= vb)))
                }),
            ],
            Protocol::Settle => vec![Property::<Self>::always(EXCLUSIVE, |_, w| {
                w.clients.iter().filter(|c| c.pc == Pc::InSection).count() <= 1
            })],
        };
        if self.sets > 0 {
            properties.push(Property::<Self>::always(SET_LANDED, |_, w| {
                w.setters.iter().enumerate().all(|(s, setter)| {
                    *setter != Setter::Done { ok: true } || w.set_landed & (1 << s) != 0
                })
            }));
            properties.push(Property::<Self>::sometimes(SET_DONE, |_, w| {
                w.setters.contains(&Setter::Done { ok: true })
            }));
            properties.push(Property::<Self>::always(SET_ONCE, |m, w| {
                (0..m.sets).all(|setter| {
                    let client = m.clients + setter;
                    // The versions of the rows written since the set's first landing that knew
                    // of it: updates merged into it, and sets sent after it landed.
                    let knew = |r: &Row| match *r {
                        Row::State {
                            updates,
                            generation,
                            client: c,
                            ..
                        } => {
                            if m.is_setter(c) {
                                generation & (1 << setter) != 0
                            } else {
                                updates & set_bit(setter) != 0
                            }
                        }
                        _ => false,
                    };
                    let mut since: Option<Vec<u64>> = None;
                    for r in &w.written {
                        let Row::State {
                            version, client: c, ..
                        } = r
                        else {
                            continue;
                        };
                        match &mut since {
                            Some(others) if *c != client && knew(r) => others.push(*version),
                            Some(_) if *c != client => {}
                            Some(others) if others.iter().any(|v| v <= version) => return false,
                            None if *c == client => since = Some(vec![]),
                            _ => {}
                        }
                    }
                    true
                })
            }));
            properties.push(Property::<Self>::always(SET_KEPT, |_, w| {
                w.written.iter().all(|r| match r {
                    Row::State {
                        after_set: true,
                        updates,
                        ..
                    } => updates & SET_BITS != 0,
                    _ => true,
                })
            }));
        }
        // The checks are not vacuous: some run gets through.
        properties.push(Property::<Self>::sometimes(COMPLETES, |_, w| {
            w.acknowledged != 0
        }));
        if self.sets > 0 && self.clients > 1 && self.protocol == Protocol::Fenced {
            properties.push(Property::<Self>::sometimes(
                SET_PASSES_A_LIVE_FLOOR,
                |m, w| {
                    (0..m.replicas).any(|replica| {
                        let view = w.view(replica);
                        let newest = protocol::fenced::fold(log(view.clone()));
                        // The row `FINAL` returns: the highest version, the last inserted of equals.
                        let mut top: Option<(u64, u8)> = None;
                        for r in view.clone() {
                            if let Row::State {
                                version, client, ..
                            } = r
                                && top.is_none_or(|(v, _)| *version >= v)
                            {
                                top = Some((*version, *client));
                            }
                        }
                        // Anywhere, not only in this view: the holder has written nothing.
                        let written_under = w.written.iter().any(|r| {
                            matches!(r, Row::State { generation, client, .. }
                            if !m.is_setter(*client) && *generation == newest.generation)
                        });
                        // A grant that followed a release, still within its lease.
                        let followed_a_release = log(view.clone()).any(|e| {
                            e.generation + 1 == newest.generation
                                && e.event == protocol::rows::Event::Release
                        });
                        newest.generation >= 2
                            && followed_a_release
                            && newest.released == 0
                            && newest.forced == 0
                            && w.now < newest.lease_until_ms
                            && !written_under
                            && top.is_some_and(|(version, client)| {
                                // Above the floor, which is at or above what the holder read.
                                m.is_setter(client) && version > newest.floor_ms
                            })
                    })
                },
            ));
        }
        if self.crashes > 0 {
            properties.push(Property::<Self>::always(NOT_LOCKED_OUT, |_, w| {
                !w.locked_out
            }));
            properties.push(Property::<Self>::sometimes(RECOVERS, |_, w| w.recovered));
        }
        if self.updates > 1 && self.clients > 1 {
            properties.push(Property::<Self>::sometimes(GIVES_BACK, |_, w| w.gave_back));
            if self.timeout > 0 {
                properties.push(Property::<Self>::sometimes(HEEDS_WANT, |_, w| w.heeded));
            }
        }
        if self.clients == 1 {
            properties.push(Property::<Self>::always(UNCONTENDED, |_, w| {
                !w.clients[0].saw_held
            }));
        }
        properties
    }
}
