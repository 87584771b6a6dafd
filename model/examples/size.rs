//! Explores one configuration of the model and prints its size and what it found, for tuning
//! bounds: `K=lease H=horizon S=skew L=lost W=window R=renew(0/1) A=attempts F=forces C=clients
//! G=merges M=mutant index P=settle SHOW=property prefix cargo run -p lock-model --example size`.
use lock_model::{LockModel, Mutant};
use stateright::{Checker, HasDiscoveries, Model};

fn main() {
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let mut m = if env("P", 0) == 1 {
        LockModel::settle()
    } else {
        LockModel::fenced()
    };
    m.horizon = env("H", m.horizon);
    m.lost_responses = env("L", m.lost_responses as u64) as u8;
    m.window_expiries = env("W", m.window_expiries as u64) as u8;
    m.renew = env("R", m.renew as u64) == 1;
    m.skew = env("S", m.skew);
    m.attempts = env("A", m.attempts as u64) as u8;
    m.lease = env("K", m.lease);
    m.forces = env("F", m.forces as u64) as u8;
    m.clients = env("C", m.clients as u64) as u8;
    m.merges = env("G", m.merges as u64) as u8;
    let mutants = [
        None,
        Some(Mutant::NoRenewConfirm),
        Some(Mutant::NoGiveWay),
        Some(Mutant::NoFloor),
        Some(Mutant::NoWriteConfirm),
        Some(Mutant::NoQuorum),
        Some(Mutant::SettleBeforeInsert),
    ];
    m.mutant = mutants[env("M", 0) as usize];
    let started = std::time::Instant::now();
    let c = m
        .checker()
        .threads(2)
        .finish_when(HasDiscoveries::AnyFailures)
        .target_state_count(env("MAX", 50_000_000) as usize)
        .spawn_bfs()
        .join();
    if let Ok(show) = std::env::var("SHOW") {
        for (name, path) in c.discoveries() {
            if name.starts_with(&show) {
                println!("{name}: {:#?}", path.last_state());
                println!("{:#?}", path.into_actions());
            }
        }
    }
    println!(
        "{} states ({} unique) depth {} in {:.1}s; discoveries {:?}",
        c.state_count(),
        c.unique_state_count(),
        c.max_depth(),
        started.elapsed().as_secs_f64(),
        c.discoveries().keys().collect::<Vec<_>>()
    );
}
