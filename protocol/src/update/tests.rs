//! The update machine's unit tests.

use super::*;
use crate::config::Config;
use crate::env::{Env, Level};
use crate::error::Error;
use crate::fenced::{self, LogEntry};
use crate::grant::{Kept, LockHandle, Memory, StoredRow};
use crate::guard::Guard;
use crate::rows::{Claim, Event, NewestGeneration, Outlook};

struct Clock {
    now: u64,
    tokens: u64,
}

impl Env for Clock {
    fn now_ms(&self) -> u64 {
        self.now
    }
    fn new_token(&mut self) -> String {
        self.tokens += 1;
        format!("t{}", self.tokens)
    }
    fn random(&mut self) -> u64 {
        0
    }
    fn log(&mut self, _: Level, _: &str) {}
}

const LIMITS: Limits = Limits {
    lease_ms: 10_000,
    timeout_ms: 10_000,
    retry_ms: 100,
    linger_ms: 5_000,
    retry_pause_ms: 2_000,
};

fn claims_of(statement: &Statement, owner: &str, generation: u64) -> Vec<Claim> {
    assert!(
        matches!(statement, Statement::ReadClaims { .. }),
        "{statement:?}"
    );
    vec![Claim {
        owner: owner.into(),
        at_ms: 0,
        until_ms: 0,
        newest: generation,
        previous_until: 0,
        stored: vec![],
    }]
}

/// A server so slow that every claim lands when its lease is nearly over: the update gives
/// its grants back and claims anew a bounded number of times, then fails, instead of
/// claiming forever (nothing in that cycle waits, so the lock's timeout never ends it).
#[test]
fn an_update_whose_every_claim_outlasts_its_lease_gives_up() {
    // whether the grants are given back or their release fails
    for releases_fail in [false, true] {
        every_claim_outlasts_its_lease(releases_fail);
    }
}

fn every_claim_outlasts_its_lease(releases_fail: bool) {
    let mut env = Clock { now: 0, tokens: 0 };
    let memory = Memory::default();
    let mut update = Update::new("s", "{\"a\":1}", "{}", LIMITS, memory, 0);
    let mut step = update.start(&mut env);
    let mut claims = 0;
    for _ in 0..100 {
        let Step::Send { statement, .. } = step.clone() else {
            break;
        };
        let answer = match &statement {
            Statement::ReadOutlook { .. } => Answer::Outlook(Outlook::default()),
            Statement::Append(entry) if entry.event == Event::Acquire => {
                claims += 1;
                // the claim's answer comes back at the end of its lease
                env.now = entry.until_ms;
                Answer::Appended
            }
            Statement::Append(_) if releases_fail => {
                Answer::Failed(Error::Unreachable("reset".into()))
            }
            Statement::Append(_) => Answer::Appended,
            Statement::ReadClaims { generation, .. } => {
                let owner = format!("t{}", env.tokens);
                Answer::Claims(claims_of(&statement, &owner, *generation))
            }
            other => panic!("unexpected {other:?}"),
        };
        step = update.answer(answer, &mut env);
    }
    match step {
        Step::Done(Err(Error::LockLost(why))) => {
            assert!(why.contains("ran out 3 times"), "{why}");
        }
        other => panic!("expected the update to give up, got {other:?}"),
    }
    assert_eq!(claims, 3);
    // The last grant was given back: the next update claims without reading first.
    assert_eq!(update.memory().released.is_some(), !releases_fail);
}

/// A server that fails every write of a claim not yet confirmed until the grant's lease runs
/// out: each time the claim is kept in doubt and the lock taken anew, a bounded number of
/// times (`MAX_HAND_BACKS`), then the update fails, instead of claiming forever.
#[test]
fn an_update_whose_unconfirmed_writes_all_outlast_their_lease_gives_up() {
    let mut env = Clock { now: 0, tokens: 0 };
    let mut update = Update::new("s", "{\"a\":1}", "{}", LIMITS, Memory::default(), 0);
    let mut step = update.start(&mut env);
    let (mut claims, mut writes, mut lease_until) = (0, 0, 0);
    for _ in 0..100 {
        let Step::Send { statement, .. } = step.clone() else {
            break;
        };
        let answer = match &statement {
            Statement::ReadOutlook { .. } => Answer::Outlook(Outlook::default()),
            Statement::ReadNewest { .. } => Answer::NewestGeneration(Default::default()),
            Statement::Append(entry) if entry.event == Event::Acquire => {
                claims += 1;
                lease_until = entry.until_ms;
                Answer::Appended
            }
            Statement::Append(_) => Answer::Appended,
            Statement::ReadClaims { generation, .. } => {
                let owner = format!("t{}", env.tokens);
                Answer::Claims(claims_of(&statement, &owner, *generation))
            }
            Statement::WriteGuarded { guard, .. } => {
                assert!(!guard.confirmed, "every write is the unconfirmed claim's");
                writes += 1;
                // the write fails until the lease has run out
                env.now = lease_until;
                Answer::Failed(Error::Unreachable("reset".into()))
            }
        };
        step = update.answer(answer, &mut env);
    }
    assert!(
        matches!(step, Step::Done(Err(Error::Unreachable(_)))),
        "expected the update to give up, got {step:?}"
    );
    assert_eq!((claims, writes), (3, 3));
}

/// An update's grant lasts the lock timeout, within [10 s, `lock_lease_seconds`]: with
/// Meltano's 10 s a killed holder keeps the id 10 s at most, not the explicit lock's 300 s.
#[test]
fn an_updates_lease_is_the_lock_timeout_within_bounds() {
    for ((lease, timeout), expected) in [
        ((300_000, 10_000), 10_000),
        ((300_000, 30_000), 30_000),
        ((300_000, 2_000), MIN_UPDATE_LEASE_MS),
        ((300_000, 900_000), 300_000),
        ((4_000, 30_000), 4_000),
    ] {
        assert_eq!(
            update_lease(lease, timeout, MIN_UPDATE_LEASE_MS),
            expected,
            "{lease} {timeout}"
        );
    }
    let config = Config::parse(
        "clickhouse://u@h/db",
        &[("lock_timeout_seconds".to_string(), "10".to_string())],
    )
    .expect("a configuration");
    assert_eq!(config.lock_lease_ms, 300_000);
    let mut env = clock();
    let limits = Limits::of(&config);
    let mut update = Update::new("s", "{}", "{}", limits, Memory::default(), env.now);
    update.start(&mut env);
    let claim = append_of(&update.answer(Answer::Outlook(Outlook::default()), &mut env));
    assert_eq!(
        (claim.event, claim.until_ms),
        (Event::Acquire, env.now + 10_000)
    );
}

/// The server is down for longer than the grant's lease lets the write try: the grant is
/// given back with a cap covering the version that may still land, the lock taken anew and
/// the update written under the new grant. A failure with time left on the lease, or one
/// that is not transient, fails the update as before.
#[test]
fn a_write_that_fails_until_the_lease_ends_is_written_under_a_new_grant() {
    let mut env = clock();
    let handle = grant(5, env.now + 8_000);
    let mut update = update_with(kept(handle.clone(), Some(row(90_000))), &env);
    let (attempted, _) = write_of(&update.start(&mut env));
    // the driver's retries stop one pause before the lease's margin
    env.now = handle.lease_until_ms - fenced::lease_margin_ms(LIMITS.lease_ms) - 1_500;
    let down = Error::Unreachable("tried 9 times; the lock's lease would end".into());
    let release = append_of(&update.answer(Answer::Failed(down.clone()), &mut env));
    assert_eq!(release.event, Event::Release);
    assert_eq!(release.generation, 5);
    assert!(release.until_ms >= attempted, "the cap covers the write");
    // released: the next grant follows it without a read
    let claim = append_of(&update.answer(Answer::Appended, &mut env));
    assert_eq!((claim.event, claim.generation), (Event::Acquire, 6));
    assert!(claim.floor_ms > attempted, "the new grant writes above it");
    let (version, guard) = write_of(&update.answer(Answer::Appended, &mut env));
    assert_eq!(guard.generation, 6);
    assert!(version > attempted);
    assert_eq!(
        update.answer(Answer::RowsWritten(Some(1)), &mut env),
        Step::Done(Ok(()))
    );
    // With time left, or a permanent error: released, and the caller gets the error.
    for (left, error) in [(5_000, down), (1_000, Error::InvalidInput("bad".into()))] {
        let mut env = clock();
        let handle = grant(5, env.now + 8_000);
        let mut update = update_with(kept(handle.clone(), Some(row(90_000))), &env);
        write_of(&update.start(&mut env));
        env.now = handle.lease_until_ms - left;
        let release = append_of(&update.answer(Answer::Failed(error.clone()), &mut env));
        assert_eq!(release.event, Event::Release);
        assert_eq!(
            update.answer(Answer::Appended, &mut env),
            Step::Done(Err(error))
        );
    }
}

/// A claim's first write fails until the claim's lease is nearly over: nobody knows whether
/// the claim won, so it is kept in doubt (not released: it may not be this update's to
/// release) and the log read to settle it; found taken by another meanwhile, the update
/// waits for that holder.
#[test]
fn a_claims_write_that_fails_until_its_lease_ends_leaves_the_claim_in_doubt() {
    let mut env = clock();
    let mut update = update_with(Memory::default(), &env);
    update.start(&mut env);
    let free = Outlook {
        newest: NewestGeneration {
            released: 1,
            ..rival(3, env.now - 1_000)
        },
        stored: Some(row(95_000)),
    };
    let claim = append_of(&update.answer(Answer::Outlook(free), &mut env));
    write_of(&update.answer(Answer::Appended, &mut env));
    env.now = claim.until_ms - fenced::lease_margin_ms(LIMITS.lease_ms) - 1_500;
    let down = Error::Unreachable("tried 9 times; the lock's lease would end".into());
    let step = update.answer(Answer::Failed(down), &mut env);
    assert!(
        matches!(sent(&step), Statement::ReadOutlook { .. }),
        "{step:?}"
    );
    let Phase::ReadingOutlook { doubt: Some(doubt) } = &update.phase else {
        panic!("the claim is not in doubt: {:?}", update.phase);
    };
    assert_eq!((doubt.handle.token, doubt.followed.generation), (4, 3));
    let taken = Outlook {
        newest: rival(5, env.now + 9_000),
        stored: None,
    };
    let step = update.answer(Answer::Outlook(taken), &mut env);
    assert!(matches!(
        past_want(&mut update, step, &mut env),
        Step::Pause(_)
    ));
}

/// A kept grant's write fails until its lease ends, and so does the release that gives it
/// back: the grant ends with its lease, and the update reads the log for a new claim (it
/// follows no release of its own).
#[test]
fn a_failed_release_while_handing_back_leads_to_a_read_not_a_guess() {
    let mut env = clock();
    let handle = grant(5, env.now + 8_000);
    let mut update = update_with(kept(handle.clone(), Some(row(90_000))), &env);
    write_of(&update.start(&mut env));
    env.now = handle.lease_until_ms - fenced::lease_margin_ms(LIMITS.lease_ms) - 1_500;
    let down = Error::Unreachable("tried 9 times; the lock's lease would end".into());
    let release = append_of(&update.answer(Answer::Failed(down.clone()), &mut env));
    assert_eq!((release.event, release.generation), (Event::Release, 5));
    let step = update.answer(Answer::Failed(down), &mut env);
    assert!(
        matches!(sent(&step), Statement::ReadOutlook { .. }),
        "{step:?}"
    );
    assert!(update.memory().released.is_none());
}

/// Without a linger the grant is released once the write is stored, its cap the version
/// written; the next update of this instance follows it without reading first.
#[test]
fn without_linger_the_grant_is_released_after_the_write() {
    let mut env = clock();
    let limits = Limits {
        linger_ms: 0,
        ..LIMITS
    };
    let mut update = Update::new("s", "{}", "{}", limits, Memory::default(), env.now);
    update.start(&mut env);
    update.answer(Answer::Outlook(Outlook::default()), &mut env);
    let (version, _) = write_of(&update.answer(Answer::Appended, &mut env));
    let release = append_of(&update.answer(Answer::RowsWritten(Some(1)), &mut env));
    assert_eq!((release.event, release.until_ms), (Event::Release, version));
    assert_eq!(
        update.answer(Answer::Appended, &mut env),
        Step::Done(Ok(()))
    );
    let memory = update.into_memory();
    assert!(memory.kept.is_none());
    assert_eq!(memory.released.map(|n| n.release_cap_ms), Some(version));
}

/// What this instance released last: generation 3, owned by "me".
fn own_release() -> NewestGeneration {
    fenced::released(&grant(3, 95_000))
}

/// Two writers alternating on one id: the second finds the first's grant (kept, or just
/// taken) and waits; from then on the id is shared, and neither keeps a grant after an
/// update, so neither waits for the other's linger.
#[test]
fn an_update_that_waited_keeps_no_grant_afterwards() {
    let mut env = clock();
    let mut update = update_with(Memory::default(), &env);
    update.start(&mut env);
    let outlook = Outlook {
        newest: rival(3, env.now + 5_000),
        stored: None,
    };
    let step = update.answer(Answer::Outlook(outlook), &mut env);
    assert!(matches!(
        past_want(&mut update, step, &mut env),
        Step::Pause(_)
    ));
    assert!(update.memory().shared(env.now));
    env.now += 6_000;
    update.answer(Answer::Resumed, &mut env);
    let freed = Outlook {
        newest: NewestGeneration {
            released: 1,
            ..rival(3, env.now - 1_000)
        },
        stored: Some(row(95_000)),
    };
    update.answer(Answer::Outlook(freed), &mut env);
    update.answer(Answer::Appended, &mut env);
    let release = append_of(&update.answer(Answer::RowsWritten(Some(1)), &mut env));
    assert_eq!((release.event, release.generation), (Event::Release, 4));
    update.answer(Answer::Appended, &mut env);
    let memory = update.into_memory();
    assert!(memory.kept.is_none() && memory.shared(env.now));
}

/// A shared id is read before it is claimed, though this instance released the last
/// generation it knows of, and its grant is given back after the write. Its own release
/// found the newest, the mark runs out as it was; another's, and it lasts another lease.
/// Once it has run out, the claim follows the own release without reading, and the grant
/// is kept.
#[test]
fn a_shared_id_is_read_first_and_stays_shared_while_another_writes_it() {
    let mut env = clock();
    let until = env.now + 5_000;
    let memory = Memory {
        released: Some(own_release()),
        last_written: Some(row(95_000)),
        shared_until_ms: until,
        ..Memory::default()
    };
    let alone = Outlook {
        newest: own_release(),
        stored: Some(row(95_000)),
    };
    let mut update = update_with(memory.clone(), &env);
    let step = update.start(&mut env);
    assert!(
        matches!(sent(&step), Statement::ReadOutlook { .. }),
        "{step:?}"
    );
    update.answer(Answer::Outlook(alone), &mut env);
    update.answer(Answer::Appended, &mut env);
    let release = append_of(&update.answer(Answer::RowsWritten(Some(1)), &mut env));
    assert_eq!(release.event, Event::Release);
    update.answer(Answer::Appended, &mut env);
    let after = update.into_memory();
    assert_eq!(after.shared_until_ms, until, "not extended");
    assert!(after.kept.is_none());

    // Someone else's generation is the newest: shared for another lease.
    let mut update = update_with(memory.clone(), &env);
    update.start(&mut env);
    let other = Outlook {
        newest: NewestGeneration {
            released: 1,
            ..rival(4, env.now - 1_000)
        },
        stored: Some(row(96_000)),
    };
    update.answer(Answer::Outlook(other), &mut env);
    assert_eq!(update.memory().shared_until_ms, env.now + LIMITS.lease_ms);

    // Run out: a claim without reading, and the grant kept.
    env.now = until;
    let mut update = update_with(memory, &env);
    let claim = append_of(&update.start(&mut env));
    assert_eq!((claim.event, claim.generation), (Event::Acquire, 4));
    update.answer(Answer::Appended, &mut env);
    assert_eq!(
        update.answer(Answer::RowsWritten(Some(1)), &mut env),
        Step::Done(Ok(()))
    );
    assert!(update.memory().kept.is_some());
}

/// A claim that followed this instance's own release without reading, lost to a claim that
/// came between: the log is read at once (no pause: that claimant may be done already), and
/// the id is shared from then on.
#[test]
fn a_lost_claim_that_followed_its_own_release_reads_the_log_at_once() {
    let mut env = clock();
    let memory = Memory {
        released: Some(own_release()),
        last_written: Some(row(95_000)),
        ..Memory::default()
    };
    let mut update = update_with(memory, &env);
    let claim = append_of(&update.start(&mut env));
    assert_eq!((claim.event, claim.generation), (Event::Acquire, 4));
    update.answer(Answer::Appended, &mut env);
    let step = update.answer(Answer::RowsWritten(Some(0)), &mut env);
    let claims = claims_of(sent(&step), "rival", 4);
    let step = update.answer(Answer::Claims(claims), &mut env);
    assert!(
        matches!(sent(&step), Statement::ReadOutlook { .. }),
        "{step:?}"
    );
    assert!(update.memory().shared(env.now));
    // Found held: a claim read from the log that loses is waited for, as any holder is.
    let held_by_rival = Outlook {
        newest: rival(4, env.now + 5_000),
        stored: None,
    };
    let step = update.answer(Answer::Outlook(held_by_rival), &mut env);
    assert!(matches!(
        past_want(&mut update, step, &mut env),
        Step::Pause(_)
    ));
}

/// An unconfirmed grant's writes are refused once the generation its claim replaced, free
/// only because its lease had ended, is renewed past that end; a released or forced one, or
/// a confirmed grant, sets no such bound.
#[test]
fn an_unconfirmed_grant_guards_against_a_renewal_of_the_generation_it_replaced() {
    let guard_after = |claimed_after: Option<NewestGeneration>| {
        Grant {
            handle: grant(4, 90_000),
            basis: None,
            claimed_after,
        }
        .guard()
        .previous_until
    };
    let expired = held(&grant(3, 60_000));
    assert_eq!(guard_after(Some(expired.clone())), 60_000);
    let released = NewestGeneration {
        released: 1,
        ..expired.clone()
    };
    assert_eq!(guard_after(Some(released)), u64::MAX);
    let forced = NewestGeneration {
        forced: 1,
        ..expired
    };
    assert_eq!(guard_after(Some(forced)), u64::MAX);
    assert_eq!(guard_after(None), u64::MAX, "confirmed");
}

fn grant(token: u64, lease_until_ms: u64) -> LockHandle {
    LockHandle {
        state_id: "s".into(),
        owner: "me".into(),
        token,
        acquired_at_ms: 0,
        lease_until_ms,
        floor_ms: 0,
        last_written_ms: 0,
        mode: crate::config::LockMode::Fenced,
    }
}

/// The log's newest generation: `handle`'s grant, open.
fn held(handle: &LockHandle) -> NewestGeneration {
    NewestGeneration {
        generation: handle.token,
        owner: handle.owner.clone(),
        lease_until_ms: handle.lease_until_ms,
        ..NewestGeneration::default()
    }
}

/// A later generation, held by someone else until `until`.
fn rival(token: u64, until: u64) -> NewestGeneration {
    NewestGeneration {
        generation: token,
        owner: "rival".into(),
        lease_until_ms: until,
        ..NewestGeneration::default()
    }
}

fn kept(handle: LockHandle, basis: Option<StoredRow>) -> Memory {
    Memory {
        kept: Some(Kept {
            handle,
            basis,
            last_used_ms: 0,
            checked_ms: 0,
        }),
        ..Memory::default()
    }
}

fn row(version: u64) -> StoredRow {
    (Some("{}".into()), Some("{\"v\":1}".into()), version)
}

/// A waiter says it wants the grant it waits for, once, before its pause: the step after
/// that row.
fn past_want(update: &mut Update, step: Step, env: &mut impl Env) -> Step {
    match &step {
        Step::Send {
            statement: Statement::Append(row),
            retry_until_ms,
        } if row.event == Event::Want => {
            assert_eq!(*retry_until_ms, Some(env.now_ms()), "a hint is not retried");
            update.answer(Answer::Appended, env)
        }
        _ => step,
    }
}

fn sent(step: &Step) -> &Statement {
    match step {
        Step::Send { statement, .. } => statement,
        other => panic!("expected a statement, got {other:?}"),
    }
}

/// The guarded write `step` sends: (version, guard).
fn write_of(step: &Step) -> (u64, Guard) {
    match sent(step) {
        Statement::WriteGuarded {
            version_ms, guard, ..
        } => (*version_ms, guard.clone()),
        other => panic!("expected a guarded write, got {other:?}"),
    }
}

fn append_of(step: &Step) -> LogEntry {
    match sent(step) {
        Statement::Append(entry) => entry.clone(),
        other => panic!("expected a row of the lock log, got {other:?}"),
    }
}

/// A clock at 100 s.
fn clock() -> Clock {
    Clock {
        now: 100_000,
        tokens: 0,
    }
}

/// A kept grant (generation 5, 8 s of lease left, state at 90 s) whose write was refused:
/// the update, reading back what decides it, and the version it tried.
fn refused_kept_write(env: &mut Clock) -> (Update, LockHandle, u64) {
    let handle = grant(5, env.now + 8_000);
    let mut update = update_with(kept(handle.clone(), Some(row(90_000))), env);
    let (attempted, _) = write_of(&update.start(env));
    let step = update.answer(Answer::RowsWritten(Some(0)), env);
    assert!(
        matches!(sent(&step), Statement::ReadOutlook { .. }),
        "{step:?}"
    );
    (update, handle, attempted)
}

fn update_with(memory: Memory, env: &Clock) -> Update {
    Update::new("s", "{\"a\":1}", "{}", LIMITS, memory, env.now)
}

/// A kept grant with less than half its lease left is renewed (checked in the log, the renew
/// row appended, checked again) before the write, which then goes under the new lease; with
/// half or more left it is written under at once.
#[test]
fn a_kept_grant_past_half_its_lease_is_renewed_before_the_write() {
    let mut env = clock();
    let handle = grant(5, env.now + 4_000);
    let mut update = update_with(kept(handle.clone(), Some(row(90_000))), &env);
    let step = update.start(&mut env);
    assert!(
        matches!(sent(&step), Statement::ReadNewest { .. }),
        "{step:?}"
    );
    let step = update.answer(Answer::NewestGeneration(held(&handle)), &mut env);
    let renew = append_of(&step);
    assert_eq!(
        (renew.event, renew.until_ms),
        (Event::Renew, env.now + LIMITS.lease_ms)
    );
    let step = update.answer(Answer::Appended, &mut env);
    assert!(
        matches!(sent(&step), Statement::ReadNewest { .. }),
        "{step:?}"
    );
    let step = update.answer(Answer::NewestGeneration(held(&handle)), &mut env);
    let (version, guard) = write_of(&step);
    assert_eq!(
        (version, guard.generation, guard.confirmed),
        (env.now, 5, true)
    );
    let step = update.answer(Answer::RowsWritten(Some(1)), &mut env);
    assert_eq!(step, Step::Done(Ok(())));
    let memory = update.into_memory();
    let after = memory.kept.expect("the grant is kept for the linger");
    assert_eq!(after.handle.lease_until_ms, env.now + LIMITS.lease_ms);
    assert_eq!(after.basis.map(|(_, _, v)| v), Some(env.now));

    for left in [LIMITS.lease_ms / 2, LIMITS.lease_ms / 2 + 1_000] {
        let handle = grant(5, env.now + left);
        let mut update = update_with(kept(handle, Some(row(90_000))), &env);
        let step = update.start(&mut env);
        assert_eq!(write_of(&step).0, env.now, "{left} ms left");
    }
}

/// A stream's renewal that finds its grant wanted (another instance appended a `want` row
/// while it waited) writes, then gives the grant back instead of keeping it: the waiter
/// gets the id after this update, not after the stream.
#[test]
fn a_kept_grant_found_wanted_is_given_back_after_the_write() {
    let mut env = clock();
    let handle = grant(5, env.now + 4_000);
    let mut update = update_with(kept(handle.clone(), Some(row(90_000))), &env);
    let wanted = NewestGeneration {
        wanted: 1,
        ..held(&handle)
    };
    update.start(&mut env);
    let step = update.answer(Answer::NewestGeneration(wanted.clone()), &mut env);
    assert_eq!(append_of(&step).event, Event::Renew);
    update.answer(Answer::Appended, &mut env);
    let step = update.answer(Answer::NewestGeneration(wanted), &mut env);
    write_of(&step);
    let step = update.answer(Answer::RowsWritten(Some(1)), &mut env);
    assert_eq!(append_of(&step).event, Event::Release, "{step:?}");
    assert_eq!(
        update.answer(Answer::Appended, &mut env),
        Step::Done(Ok(()))
    );
    let memory = update.into_memory();
    assert!(memory.kept.is_none());
    assert!(memory.shared(env.now));
}

/// A waiter says once per holder that it wants the lock, and only then pauses; the row
/// names the holder's generation, and its failure does not end the wait.
#[test]
fn a_waiter_wants_each_holder_once() {
    let mut env = clock();
    let mut update = update_with(Memory::default(), &env);
    update.start(&mut env);
    let until = env.now + 60_000;
    let held = |token| Outlook {
        newest: rival(token, until),
        stored: None,
    };
    let step = update.answer(Answer::Outlook(held(6)), &mut env);
    let want = append_of(&step);
    assert_eq!(
        (fenced::wanted_generation(&want), want.generation),
        (Some(6), 0),
        "generation 6 wanted, in generation 0 (never a grant's)"
    );
    assert_eq!(want.state_id, "s");
    let failed = Error::Unreachable("down".into());
    assert!(matches!(
        update.answer(Answer::Failed(failed), &mut env),
        Step::Pause(_)
    ));
    update.answer(Answer::Resumed, &mut env);
    let step = update.answer(Answer::Outlook(held(6)), &mut env);
    assert!(
        matches!(step, Step::Pause(_)),
        "the same holder again: {step:?}"
    );
    update.answer(Answer::Resumed, &mut env);
    let step = update.answer(Answer::Outlook(held(7)), &mut env);
    assert_eq!(fenced::wanted_generation(&append_of(&step)), Some(7));
}

/// A renewal whose renew row landed after a later generation was claimed (the holder
/// stalled, or its clock is behind) does not adopt the new lease: writes inside it would
/// skip the log check and could overwrite the newer holder's state.
#[test]
fn a_renewal_that_finds_a_later_generation_is_not_adopted() {
    let now = 100_000;
    let handle = grant(5, now + 4_000);
    let until = now + LIMITS.lease_ms;
    let (renewal, next) = Renewal::start(handle.clone(), until, now, LIMITS.lease_ms);
    assert!(matches!(next, Renewing::Send(Statement::ReadNewest { .. })));
    let (renewal, next) = renewal.answer(Answer::NewestGeneration(held(&handle)), now);
    assert!(matches!(next, Renewing::Send(Statement::Append(_))));
    let (renewal, next) = renewal.answer(Answer::Appended, now);
    assert!(matches!(next, Renewing::Send(Statement::ReadNewest { .. })));
    let (_, next) = renewal.answer(Answer::NewestGeneration(rival(6, until)), now);
    assert!(
        matches!(next, Renewing::Failed(Error::LockLost(_), ref h) if h.lease_until_ms == handle.lease_until_ms),
        "{next:?}"
    );

    // Found before the renew row is sent: nothing is appended.
    let (renewal, _) = Renewal::start(handle.clone(), until, now, LIMITS.lease_ms);
    let (_, next) = renewal.answer(Answer::NewestGeneration(rival(6, until)), now);
    assert!(
        matches!(next, Renewing::Failed(Error::LockLost(_), _)),
        "{next:?}"
    );
}

/// A kept grant that turns out lost when renewed: the update takes the lock anew.
#[test]
fn a_kept_grant_found_lost_is_taken_anew() {
    let mut env = clock();
    let handle = grant(5, env.now + 4_000);
    let mut update = update_with(kept(handle, None), &env);
    update.start(&mut env);
    let step = update.answer(
        Answer::NewestGeneration(rival(6, env.now + 9_000)),
        &mut env,
    );
    assert!(
        matches!(sent(&step), Statement::ReadOutlook { .. }),
        "{step:?}"
    );
}

/// A first write goes under the claim's guard: the stored version it merged into, the
/// claim not yet confirmed, and the generation it followed, which was released, not
/// checked for a late renewal (only a generation that ended by its lease can be renewed
/// after it was read).
#[test]
fn a_first_write_is_guarded_by_what_it_merged_into() {
    let mut env = clock();
    let mut update = update_with(Memory::default(), &env);
    let step = update.start(&mut env);
    assert!(
        matches!(sent(&step), Statement::ReadOutlook { .. }),
        "{step:?}"
    );
    let released = NewestGeneration {
        generation: 3,
        owner: "before".into(),
        lease_until_ms: env.now + 2_000,
        released: 1,
        release_cap_ms: 95_000,
        ..NewestGeneration::default()
    };
    let outlook = Outlook {
        newest: released.clone(),
        stored: Some(row(95_000)),
    };
    let step = update.answer(Answer::Outlook(outlook), &mut env);
    let claim = append_of(&step);
    assert_eq!((claim.event, claim.generation), (Event::Acquire, 4));
    let step = update.answer(Answer::Appended, &mut env);
    let (version, guard) = write_of(&step);
    assert_eq!(version, env.now);
    assert_eq!(guard.expected_version, 95_000);
    assert!(!guard.confirmed);
    // The released holder's renewal, stalled, landed after its release: the claim still
    // wins on its first write.
    let claims = [Claim {
        owner: guard.owner.clone(),
        newest: 4,
        previous_until: released.lease_until_ms + 5_000,
        ..Claim::default()
    }];
    let newest = NewestGeneration {
        generation: 4,
        owner: guard.owner.clone(),
        ..NewestGeneration::default()
    };
    assert!(crate::guard::admits(&guard, &newest, &claims, 95_000));
}

/// A claim whose answer was lost is kept in doubt; the next update finds it the newest
/// grant and writes under it without claiming again, or, its lease over, claims anew.
#[test]
fn a_claim_in_doubt_that_is_the_newest_grant_is_written_under() {
    let mut env = clock();
    let mut update = update_with(Memory::default(), &env);
    update.start(&mut env);
    let step = update.answer(Answer::Outlook(Outlook::default()), &mut env);
    let claim = append_of(&step);
    let step = update.answer(Answer::Failed(Error::Unreachable("reset".into())), &mut env);
    assert!(
        matches!(step, Step::Done(Err(Error::Unreachable(_)))),
        "{step:?}"
    );
    let memory = update.into_memory();
    let doubt = memory.doubt.clone().expect("the claim is kept in doubt");
    assert_eq!(doubt.handle.token, claim.generation);

    let mut update = update_with(memory.clone(), &env);
    let step = update.start(&mut env);
    assert!(
        matches!(sent(&step), Statement::ReadOutlook { .. }),
        "{step:?}"
    );
    let outlook = Outlook {
        newest: held(&doubt.handle),
        stored: None,
    };
    let step = update.answer(Answer::Outlook(outlook.clone()), &mut env);
    let (_, guard) = write_of(&step);
    assert_eq!(
        (guard.generation, guard.confirmed),
        (claim.generation, false)
    );

    env.now = doubt.handle.lease_until_ms + 1;
    let mut update = update_with(memory, &env);
    update.start(&mut env);
    let step = update.answer(Answer::Outlook(outlook), &mut env);
    let again = append_of(&step);
    assert_eq!(
        (again.event, again.generation),
        (Event::Acquire, claim.generation + 1)
    );
}

/// A refused write of a kept grant is read back: a later holder means waiting for it; the
/// grant still ours with newer state means merging into that and writing again.
#[test]
fn a_refused_write_is_read_back_before_anything_else() {
    let mut env = clock();
    let (mut update, _, _) = refused_kept_write(&mut env);
    let later = Outlook {
        newest: rival(6, env.now + 9_000),
        stored: Some(row(99_000)),
    };
    let step = update.answer(Answer::Outlook(later), &mut env);
    let step = past_want(&mut update, step, &mut env);
    assert!(matches!(step, Step::Pause(_)), "{step:?}");

    let (mut update, handle, _) = refused_kept_write(&mut env);
    let changed = Outlook {
        newest: held(&handle),
        stored: Some(row(99_000)),
    };
    let step = update.answer(Answer::Outlook(changed), &mut env);
    let (version, guard) = write_of(&step);
    assert_eq!((version, guard.expected_version), (env.now, 99_000));
}

/// After a refused write, nothing is written once a contender may see the lease ended: the
/// grant is given back (its cap covering the refused version) and the lock taken anew.
#[test]
fn after_a_refused_write_near_the_lease_end_nothing_is_written() {
    let mut env = clock();
    let (mut update, handle, attempted) = refused_kept_write(&mut env);
    env.now = handle.lease_until_ms - fenced::lease_margin_ms(LIMITS.lease_ms);
    let changed = Outlook {
        newest: held(&handle),
        stored: Some(row(99_000)),
    };
    let step = update.answer(Answer::Outlook(changed), &mut env);
    let release = append_of(&step);
    assert_eq!(
        (release.event, release.generation, release.until_ms),
        (Event::Release, 5, attempted)
    );
    let step = update.answer(Answer::Appended, &mut env);
    let claim = append_of(&step);
    assert_eq!((claim.event, claim.generation), (Event::Acquire, 6));
}

/// A stored version above the lease (written by a holder whose clock is ahead) is covered by
/// a renewal of the lease to it before the write is sent: a write landing after the lease
/// ended must stay below the next grant's floor.
#[test]
fn a_version_above_the_lease_is_covered_by_a_renewal_first() {
    let mut env = clock();
    let (mut update, handle, _) = refused_kept_write(&mut env);
    let ahead = handle.lease_until_ms + 5_000;
    let changed = Outlook {
        newest: held(&handle),
        stored: Some(row(ahead)),
    };
    let step = update.answer(Answer::Outlook(changed), &mut env);
    assert!(
        matches!(sent(&step), Statement::ReadNewest { .. }),
        "{step:?}"
    );
    let step = update.answer(Answer::NewestGeneration(held(&handle)), &mut env);
    let renew = append_of(&step);
    assert_eq!(renew.event, Event::Renew);
    assert!(renew.until_ms > ahead, "{renew:?}");
    update.answer(Answer::Appended, &mut env);
    let step = update.answer(Answer::NewestGeneration(held(&handle)), &mut env);
    let (version, guard) = write_of(&step);
    assert_eq!((version, guard.expected_version), (ahead + 1, ahead));
    assert!(version <= renew.until_ms);
}

/// Every write refused because the stored state keeps changing under the grant: the update
/// gives up after a few, releasing the grant, instead of chasing an endless stream.
#[test]
fn an_update_refused_again_and_again_gives_up() {
    let mut env = clock();
    let handle = grant(5, env.now + 8_000);
    let mut update = update_with(kept(handle.clone(), Some(row(90_000))), &env);
    let mut step = update.start(&mut env);
    let mut writes = 0;
    while let Step::Send {
        statement: Statement::WriteGuarded { .. },
        ..
    } = step
    {
        writes += 1;
        update.answer(Answer::RowsWritten(Some(0)), &mut env);
        let changed = Outlook {
            newest: held(&handle),
            stored: Some(row(90_000 + writes)),
        };
        step = update.answer(Answer::Outlook(changed), &mut env);
    }
    assert_eq!(writes, u64::from(MAX_REFUSALS));
    assert_eq!(append_of(&step).event, Event::Release);
    let step = update.answer(Answer::Appended, &mut env);
    assert!(
        matches!(&step, Step::Done(Err(Error::LockLost(why))) if why.contains("kept changing")),
        "{step:?}"
    );
}

/// A lock held by another is waited for with pauses of 80 to 120 % of the retry interval,
/// the last one cut at the timeout, which then says who holds it.
#[test]
fn a_held_lock_is_waited_for_until_the_timeout() {
    struct Jittery {
        clock: Clock,
        draws: u64,
    }
    impl Env for Jittery {
        fn now_ms(&self) -> u64 {
            self.clock.now
        }
        fn new_token(&mut self) -> String {
            self.clock.new_token()
        }
        fn random(&mut self) -> u64 {
            self.draws += 1;
            self.draws.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        }
        fn log(&mut self, _: Level, _: &str) {}
    }
    let mut env = Jittery {
        clock: clock(),
        draws: 0,
    };
    let start = env.clock.now;
    let holder = rival(6, start + 60_000);
    let mut update = Update::new("s", "{}", "{}", LIMITS, Memory::default(), start);
    let mut step = update.start(&mut env);
    let mut pauses = vec![];
    loop {
        match step {
            Step::Send {
                statement: Statement::Append(ref want),
                ..
            } => {
                assert_eq!(fenced::wanted_generation(want), Some(6));
                step = update.answer(Answer::Appended, &mut env);
            }
            Step::Send { .. } => {
                let outlook = Outlook {
                    newest: holder.clone(),
                    stored: None,
                };
                step = update.answer(Answer::Outlook(outlook), &mut env);
            }
            Step::Pause(ms) => {
                pauses.push(ms);
                env.clock.now += ms;
                step = update.answer(Answer::Resumed, &mut env);
            }
            Step::Done(result) => {
                assert!(
                    matches!(&result, Err(Error::Locked(info)) if info.token == 6),
                    "{result:?}"
                );
                break;
            }
        }
    }
    assert_eq!(env.clock.now, start + LIMITS.timeout_ms);
    let (last, rest) = pauses.split_last().expect("it waited");
    assert!(*last <= LIMITS.retry_ms * 120 / 100, "{last}");
    for pause in rest {
        assert!(
            (LIMITS.retry_ms * 80 / 100..=LIMITS.retry_ms * 120 / 100).contains(pause),
            "{pause} ms"
        );
    }
    assert!(rest.iter().any(|&p| p != rest[0]), "jittered: {rest:?}");
}

fn held_for_run(handle: LockHandle, basis: Option<StoredRow>) -> Memory {
    Memory {
        run_hold: true,
        ..kept(handle, basis)
    }
}

fn hold_lost(step: &Step) -> bool {
    matches!(step, Step::Done(Err(Error::LockLost(why))) if why.contains("this run's hold"))
}

/// Under a run's hold the grant is kept after the write whatever the linger (none here) and
/// even when the id is shared: one guarded write per update, nothing released.
#[test]
fn a_run_hold_keeps_its_grant_without_a_linger() {
    let mut env = clock();
    let handle = grant(5, env.now + 8_000);
    let mut memory = held_for_run(handle, Some(row(90_000)));
    memory.shared_until_ms = env.now + 60_000;
    let limits = Limits {
        linger_ms: 0,
        ..LIMITS
    };
    let mut update = Update::new("s", "{\"a\":1}", "{}", limits, memory, env.now);
    write_of(&update.start(&mut env));
    let step = update.answer(Answer::RowsWritten(Some(1)), &mut env);
    assert_eq!(step, Step::Done(Ok(())));
    let memory = update.into_memory();
    assert!(memory.run_hold);
    assert_eq!(memory.kept.map(|k| k.handle.token), Some(5));
}

/// A held grant found taken by another (forced open) fails the update: a run never takes
/// its id anew after another may have written it.
#[test]
fn a_run_hold_found_lost_when_renewed_fails_the_update() {
    let mut env = clock();
    let handle = grant(5, env.now + 4_000);
    let mut update = update_with(held_for_run(handle, None), &env);
    update.start(&mut env);
    let step = update.answer(
        Answer::NewestGeneration(rival(6, env.now + 9_000)),
        &mut env,
    );
    // the renewal's loss sends the update to the log, which names the other
    let step = match sent(&step) {
        Statement::ReadOutlook { .. } => update.answer(
            Answer::Outlook(Outlook {
                newest: rival(6, env.now + 9_000),
                stored: None,
            }),
            &mut env,
        ),
        other => panic!("expected the log to be read, got {other:?}"),
    };
    assert!(hold_lost(&step), "{step:?}");
    // Every later update of the run fails too, even once the other has given the id back.
    let mut later = update_with(update.into_memory(), &env);
    let step = later.start(&mut env);
    assert!(matches!(sent(&step), Statement::ReadOutlook { .. }));
    let released = NewestGeneration {
        released: 1,
        ..rival(6, env.now + 9_000)
    };
    let outlook = Outlook {
        newest: released,
        stored: None,
    };
    let step = later.answer(Answer::Outlook(outlook), &mut env);
    assert!(hold_lost(&step), "{step:?}");
}

/// A run's own generation forced open (`unlock`) is not its own any more: given back, it is
/// not taken anew.
#[test]
fn a_run_hold_forced_open_is_not_taken_anew_after_its_hand_back() {
    let mut env = clock();
    let own = NewestGeneration {
        generation: 5,
        owner: "me".into(),
        lease_until_ms: env.now + 500,
        released: 1,
        forced: 1,
        ..NewestGeneration::default()
    };
    let memory = Memory {
        run_hold: true,
        released: Some(own.clone()),
        ..Memory::default()
    };
    let mut update = update_with(memory, &env);
    update.start(&mut env);
    let step = update.answer(
        Answer::Outlook(Outlook {
            newest: own,
            stored: None,
        }),
        &mut env,
    );
    assert!(hold_lost(&step), "{step:?}");
}

/// A failed write under a hold keeps the grant (nothing released), its basis dropped: the next
/// update reads what is stored before it writes.
#[test]
fn a_run_hold_keeps_its_grant_through_a_failed_write() {
    let mut env = clock();
    let handle = grant(5, env.now + 8_000);
    let mut update = update_with(held_for_run(handle, Some(row(90_000))), &env);
    write_of(&update.start(&mut env));
    let failed = Error::Server(crate::error::ServerError {
        code: 999,
        name: "SOMETHING".into(),
        message: "no".into(),
    });
    let step = update.answer(Answer::Failed(failed), &mut env);
    assert!(
        matches!(step, Step::Done(Err(Error::Server(_)))),
        "{step:?}"
    );
    let memory = update.into_memory();
    let kept = memory.kept.expect("the grant is kept");
    assert_eq!((kept.handle.token, kept.basis), (5, None));
    assert!(memory.released.is_none(), "nothing given back");
}

/// A held grant that is gone (its renewal failed, or a failed write gave it back) is taken
/// anew only when the newest generation is the run's own release: nobody came between.
#[test]
fn a_run_hold_without_its_grant_is_taken_anew_only_after_its_own_release() {
    let mut env = clock();
    let own = NewestGeneration {
        generation: 5,
        owner: "me".into(),
        lease_until_ms: env.now - 1,
        released: 1,
        ..NewestGeneration::default()
    };
    for (newest, taken) in [
        (own.clone(), true),
        (rival(6, env.now + 9_000), false),
        // a later run came and went: free, but not the run's own release
        (
            NewestGeneration {
                released: 1,
                ..rival(6, env.now - 1)
            },
            false,
        ),
    ] {
        let memory = Memory {
            run_hold: true,
            released: Some(own.clone()),
            ..Memory::default()
        };
        let mut update = update_with(memory, &env);
        let step = update.start(&mut env);
        assert!(
            matches!(sent(&step), Statement::ReadOutlook { .. }),
            "a hold never claims without reading: {step:?}"
        );
        let outlook = Outlook {
            newest: newest.clone(),
            stored: Some(row(90_000)),
        };
        let step = update.answer(Answer::Outlook(outlook), &mut env);
        if taken {
            assert_eq!(append_of(&step).event, Event::Acquire, "{newest:?}");
        } else {
            assert!(hold_lost(&step), "{newest:?}: {step:?}");
        }
    }
}

/// A refused write under a hold whose grant another now has fails with the hold lost
/// instead of waiting for the other and writing after it.
#[test]
fn a_run_hold_refused_by_another_grant_fails_the_update() {
    let mut env = clock();
    let handle = grant(5, env.now + 8_000);
    let mut update = update_with(held_for_run(handle, Some(row(90_000))), &env);
    write_of(&update.start(&mut env));
    let step = update.answer(Answer::RowsWritten(Some(0)), &mut env);
    assert!(matches!(sent(&step), Statement::ReadOutlook { .. }));
    let outlook = Outlook {
        newest: rival(6, env.now + 9_000),
        stored: Some(row(95_000)),
    };
    let step = update.answer(Answer::Outlook(outlook), &mut env);
    assert!(hold_lost(&step), "{step:?}");
}
